"""The operator CLI (`scripts/hk3s`, `python -m operator_cli`) on the operator API."""
