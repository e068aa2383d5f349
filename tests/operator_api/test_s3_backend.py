"""An `s3://` backend URL read as the Pulumi CLI (gocloud.dev s3blob, v0.46) reads it, refused by
name where the CLI would fail or where this tool could not read the lock; the age of a Pulumi lock
from the timestamp Go writes. The requests themselves run against a real S3 server in
tests/lab/test_s3_state.py."""

from __future__ import annotations

import datetime

import pytest

from operator_api.locks import describe_age, lock_age
from operator_api.s3_backend import BackendError, S3Backend

KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}


def test_the_documented_form_gives_endpoint_bucket_prefix_and_path_style() -> None:
    backend = S3Backend.parse(
        "s3://team-state/hk3s?endpoint=http://10.0.0.5:7070&s3ForcePathStyle=true&region=eu-central-1", KEYS
    )
    assert (backend.bucket, backend.prefix, backend.endpoint) == ("team-state", "hk3s/", "http://10.0.0.5:7070")
    assert backend.path_style and backend.region == "eu-central-1"


def test_a_host_port_endpoint_takes_its_scheme_from_disable_ssl_as_pulumi_does() -> None:
    plain = S3Backend.parse("s3://b?endpoint=minio:9000&disableSSL=true&use_path_style=true&region=r", KEYS)
    assert plain.endpoint == "http://minio:9000" and plain.path_style
    assert S3Backend.parse("s3://b?endpoint=minio:9000&region=r", KEYS).endpoint == "https://minio:9000"
    aws = S3Backend.parse("s3://b", {**KEYS, "AWS_REGION": "eu-west-1"})
    assert aws.endpoint == "https://s3.eu-west-1.amazonaws.com" and not aws.path_style


@pytest.mark.parametrize(
    ("url", "env", "named"),
    [
        ("s3://b?endpoint=http://h:1&forcePathStyle=true&region=r", KEYS, "forcePathStyle"),
        ("s3://b?endpoint=http://h:1", KEYS, "AWS_REGION"),
        ("s3://b?region=r", {"AWS_SECRET_ACCESS_KEY": "s"}, "AWS_ACCESS_KEY_ID not set"),
        ("s3://b?region=r", {"AWS_ACCESS_KEY_ID": "a"}, "AWS_SECRET_ACCESS_KEY not set"),
        ("s3://b?region=r&profile=team", KEYS, "profile="),
    ],
)
def test_a_backend_url_or_key_that_cannot_work_is_refused_by_name(url: str, env: dict[str, str], named: str) -> None:
    with pytest.raises(BackendError) as refused:
        S3Backend.parse(url, env)
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_the_age_of_a_lock_is_read_from_the_timestamp_pulumi_writes() -> None:
    now = datetime.datetime(2026, 12, 5, 7, 0, tzinfo=datetime.UTC).timestamp()
    assert lock_age("2026-12-05T06:59:30.123456789Z", now) == pytest.approx(29.877, abs=0.001)
    assert lock_age("2026-12-05T07:59:00+01:00", now) == pytest.approx(60)
    assert lock_age("not a time", now) is None
    assert [describe_age(s) for s in (5, 600, 7300, None)] == ["5 s old", "10 min old", "2 h old", "of unknown age"]
