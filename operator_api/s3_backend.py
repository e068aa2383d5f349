"""A stack's state in an S3 bucket (Pulumi's DIY backend, `s3://bucket[/prefix]?...`): the
URL's parts, the checks made before anything runs, and the lock objects Pulumi writes there.

The backend URL is the one the Pulumi CLI opens with gocloud.dev's s3blob driver (the version
the CLI is built with, gocloud.dev v0.46, on the AWS SDK v2): `endpoint=` (a URL, or host:port
with `disableSSL=true` choosing http), `s3ForcePathStyle=true` (or `use_path_style=true`),
`region=`, `profile=`. Any other query parameter the driver does not know makes the CLI fail,
so it is refused here first, by name.

The requests go through botocore, the library the AWS CLI is built on, with the whole AWS
credential chain the Pulumi CLI's SDK walks too: the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the shared config and credentials files with the
profile `profile=` or AWS_PROFILE names (static keys, SSO, a role to assume, a credential
process), web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN: a CI job's OIDC token),
container and instance roles; and AWS's retries. A profile named in the URL or in AWS_PROFILE
wins over keys in the environment, as in the Pulumi CLI's SDK (aws-sdk-go-v2 config,
resolveCredentialChain). The chain is read from the environment the Pulumi CLI is given (this
process's, with the caller's variables over it), so the checks use the credentials the CLI will.

Pulumi's lock: each run writes `.pulumi/locks/<org>/<project>/<stack>/<uuid>.json` with its
pid, user, host and start time, then lists the directory again and backs off when another
lock is there (pkg/backend/diy/lock.go, Lock). On a store that reads its own writes (S3 since
2020, the posix backend of a single gateway), two runs may both back off but never both go
on: that is the lock across machines. An operation of this API that makes no Pulumi run (a
reboot) takes the same lock the same way (operator_api.backend_lock). It reads the objects to
name the holder, and removes one only when an operator confirms (`unlock`).

Two rules keep the credentials where the operator sent them:
- No request follows a redirect to the address it names. A signed request carries
  `authorization` and the session token (`x-amz-security-token`); botocore never follows a
  `Location` (its HTTP session sends with redirects off; its S3 region redirect re-signs for the
  bucket's region at the endpoint the URL names or AWS's own for that region). A 3xx answer is
  refused, naming the endpoint and the fix (the endpoint and region that answer for the bucket).
- A plain `http://` endpoint (given so, or `host:port` with `disableSSL=true`) is used only with
  HK3S_S3_ALLOW_HTTP=1: over it the key id, signatures valid for minutes, the session token and
  the state itself cross the network in clear. A server on this machine or a network the
  operator trusts (a local MinIO) is the case for it. A query parameter cannot say it: the
  Pulumi CLI refuses any it does not know.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import LockHolder, StackError, shown

# Every query parameter gocloud.dev's s3blob URL opener and Pulumi's translation of the older
# names accept (gocloud.dev/blob/s3blob OpenBucketURL, gocloud.dev/aws V2ConfigFromURLParams,
# pulumi pkg/backend/diy translateLegacyS3Params); any other one fails the CLI.
KNOWN_PARAMETERS = frozenset(
    {
        "region",
        "endpoint",
        "s3ForcePathStyle",
        "use_path_style",
        "disableSSL",
        "disable_https",
        "profile",
        "hostname_immutable",
        "dualstack",
        "fips",
        "rate_limiter_capacity",
        "anonymous",
        "role",
        "request_checksum_calculation",
        "response_checksum_validation",
        "awssdk",
        "ssetype",
        "kmskeyid",
        "accelerate",
    }
)
TIMEOUT = 10.0
# The acknowledgement that lets a plain-HTTP endpoint be used (see the module's docstring).
ALLOW_HTTP = "HK3S_S3_ALLOW_HTTP"


class BackendError(StackError):
    """The S3 backend cannot be used as given; the message names the variable and the fix.
    Nothing was changed."""


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


# botocore reads the credential chain's variables (and the shared files' places, HOME among them)
# from os.environ; they are put in place only while a session resolves its credentials and makes
# its client, one session at a time.
_ENVIRONMENT = threading.Lock()


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    with _ENVIRONMENT:
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


@functools.cache
def _loader() -> Any:
    """botocore's reader of its service models, shared by every session: it keeps what it read
    (S3's model takes a good part of a second to load)."""
    import botocore.loaders  # noqa: PLC0415  (botocore is imported by the first S3 backend only: a quarter second)

    return botocore.loaders.create_loader()


def _no_credentials(profile: str) -> str:
    chosen = f"profile {profile} gives none, and " if profile else ""
    return (
        f"no AWS credentials for the S3 backend in PULUMI_BACKEND_URL ({chosen}AWS_ACCESS_KEY_ID not set): export "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for short-lived keys), or name a "
        "profile of ~/.aws/config with AWS_PROFILE or profile= in the URL (`aws sso login --profile NAME` for SSO)"
    )


def _client(
    env: Mapping[str, str], profile: str, endpoint: str, *, region: str, path_style: bool, params: Mapping[str, str]
) -> Any:
    """A botocore S3 client with the credentials the chain finds in `env` (BackendError when none)."""
    import botocore.config  # noqa: PLC0415
    import botocore.exceptions  # noqa: PLC0415
    import botocore.session  # noqa: PLC0415
    from botocore import UNSIGNED  # noqa: PLC0415

    options: dict[str, Any] = {
        "region_name": region,
        "connect_timeout": TIMEOUT,
        "read_timeout": TIMEOUT,
        "retries": {"mode": "standard", "total_max_attempts": 3},
        "s3": {"addressing_style": "path" if path_style else "virtual"},
    }
    for name in ("request_checksum_calculation", "response_checksum_validation"):
        if params.get(name):
            options[name] = params[name]
    anonymous = _true(params.get("anonymous"))
    if anonymous:
        options["signature_version"] = UNSIGNED
    with _environment(env):
        try:
            session = botocore.session.Session(profile=profile or None)
            session.register_component("data_loader", _loader())
            if not anonymous:
                credentials = session.get_credentials()
                if credentials is None:
                    raise BackendError(_no_credentials(profile))
                # SSO, an assumed role and web identity fetch their keys here, while the chain's
                # variables are in place; they refresh themselves later from what they read now.
                credentials.get_frozen_credentials()
            return session.create_client("s3", endpoint_url=endpoint, config=botocore.config.Config(**options))
        except botocore.exceptions.ProfileNotFound:
            raise BackendError(
                f"the AWS profile {shown(profile)} (profile= in PULUMI_BACKEND_URL or AWS_PROFILE) is in neither "
                "~/.aws/config nor ~/.aws/credentials (AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE): add it "
                "(`aws configure --profile NAME`) or name one that is there"
            ) from None
        except botocore.exceptions.PartialCredentialsError as error:
            raise BackendError(
                f"{error.kwargs.get('cred_var', 'a credential')} not set: the S3 backend in PULUMI_BACKEND_URL needs "
                "a key pair that may read and write its bucket; export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(and AWS_SESSION_TOKEN for short-lived keys), or name a profile with AWS_PROFILE"
            ) from None
        except (botocore.exceptions.TokenRetrievalError, botocore.exceptions.SSOTokenLoadError) as error:
            raise BackendError(
                f"the AWS SSO session of profile {shown(profile)} is missing or expired ({shown(str(error))}): "
                f"run `aws sso login --profile {shown(profile)}`"
            ) from None
        except botocore.exceptions.BotoCoreError as error:
            raise BackendError(
                f"the AWS credentials for the S3 backend in PULUMI_BACKEND_URL cannot be read "
                f"({shown(str(error))}): check AWS_PROFILE / profile= and ~/.aws/config"
            ) from None


@dataclass(frozen=True)
class S3Backend:
    """An `s3://` backend URL and the client (with its credentials) it will be opened with."""

    url: str
    bucket: str
    prefix: str
    endpoint: str  # scheme://host[:port], no trailing slash
    path_style: bool
    region: str
    profile: str
    client: Any = field(repr=False, compare=False)

    @classmethod
    def parse(cls, url: str, env: Mapping[str, str]) -> S3Backend:
        """The backend of `url` with the credentials the chain finds in `env`; BackendError when
        either cannot work."""
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(query) - KNOWN_PARAMETERS)
        if unknown:
            raise BackendError(
                f"PULUMI_BACKEND_URL has query parameter(s) {', '.join(unknown)} that Pulumi's S3 backend does "
                "not know: use s3://BUCKET?endpoint=https://HOST:PORT&s3ForcePathStyle=true&region=REGION"
            )
        if not parts.hostname:
            raise BackendError("PULUMI_BACKEND_URL names no bucket: use s3://BUCKET?region=REGION")

        def param(name: str) -> str:
            return query.get(name, [""])[-1]

        if param("role"):
            raise BackendError(
                "PULUMI_BACKEND_URL uses role=: name a profile of ~/.aws/config that assumes the role "
                "(role_arn, source_profile) with profile= instead"
            )
        profile = param("profile") or env.get("AWS_PROFILE", "")
        region = param("region") or env.get("AWS_REGION", "") or env.get("AWS_DEFAULT_REGION", "")
        if not region:
            raise BackendError(
                "no region for the S3 backend: add region=REGION to PULUMI_BACKEND_URL or set AWS_REGION"
            )
        endpoint = param("endpoint")
        if endpoint and "://" not in endpoint:
            secure = not _true(param("disableSSL")) and not _true(param("disable_https"))
            endpoint = f"{'https' if secure else 'http'}://{endpoint}"
        if not endpoint:
            endpoint = f"https://s3.{region}.amazonaws.com"
        path_style = _true(param("s3ForcePathStyle")) or _true(param("use_path_style"))
        access_key, secret_key = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
        if not profile and bool(access_key) != bool(secret_key):
            missing = "AWS_SECRET_ACCESS_KEY" if access_key else "AWS_ACCESS_KEY_ID"
            raise BackendError(
                f"{missing} not set: the S3 backend in PULUMI_BACKEND_URL needs a key pair that may read and write "
                "its bucket; export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
                "short-lived keys), or name a profile with AWS_PROFILE"
            )
        session_token = env.get("AWS_SESSION_TOKEN", "")
        if urllib.parse.urlsplit(endpoint).scheme == "http" and not _true(env.get(ALLOW_HTTP)):
            carried = "the key id, request signatures" + (
                ", the session token in AWS_SESSION_TOKEN" if session_token else ""
            )
            raise BackendError(
                f"PULUMI_BACKEND_URL's endpoint {endpoint} is plain HTTP: {carried} and the stack's state "
                "would cross the network in clear. Use an https:// endpoint, or, for a server on this machine "
                f"or a network you trust, set {ALLOW_HTTP}=1"
            )
        params = {name: param(name) for name in query}
        endpoint = endpoint.rstrip("/")
        return cls(
            url=url,
            bucket=parts.hostname,
            prefix=parts.path.strip("/") + "/" if parts.path.strip("/") else "",
            endpoint=endpoint,
            path_style=path_style,
            region=region,
            profile=profile,
            client=_client(env, profile, endpoint, region=region, path_style=path_style, params=params),
        )

    # ---- requests -------------------------------------------------------------------------
    def _call(self, what: str, operation: str, **arguments: Any) -> Any:
        """One S3 operation of the client; BackendError (one line naming the fix) for an answer it
        refuses, OSError when the endpoint does not answer."""
        import botocore.exceptions  # noqa: PLC0415

        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **arguments)
        except botocore.exceptions.ClientError as error:
            response: dict[str, Any] = error.response
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            code = str(response.get("Error", {}).get("Code") or "")
            if what == "read" and (code == "NoSuchKey" or (status == 404 and code != "NoSuchBucket")):
                return None
            if 300 <= status < 400:
                location = str(response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("location") or "")
                target = f" to {shown(location[:200])}" if location else ""
                raise BackendError(
                    f"the S3 endpoint {self.endpoint} of PULUMI_BACKEND_URL answered a {what} with a redirect "
                    f"({status}{target}); signed requests are never sent on to another address: set "
                    "endpoint= (and region=) in PULUMI_BACKEND_URL to the address that serves bucket "
                    f"{self.bucket}"
                ) from None
            raise BackendError(self._explain(status, code, what)) from None
        except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as error:
            raise ConnectionError(str(error)) from None
        except botocore.exceptions.NoCredentialsError:
            raise BackendError(_no_credentials(self.profile)) from None
        except botocore.exceptions.BotoCoreError as error:
            raise BackendError(
                f"the S3 backend (bucket {self.bucket} at {self.endpoint}) failed a {what} ({shown(str(error))}): "
                "check PULUMI_BACKEND_URL"
            ) from None

    def list_keys(self, prefix: str) -> list[str]:
        """Every object key under `prefix` (inside the URL's prefix), without the URL's prefix."""
        keys: list[str] = []
        token = ""
        while True:
            extra = {"ContinuationToken": token} if token else {}
            answer = self._call("list", "list_objects_v2", Prefix=self.prefix + prefix, **extra)
            keys.extend(str(item["Key"]).removeprefix(self.prefix) for item in answer.get("Contents") or [])
            token = str(answer.get("NextContinuationToken") or "")
            if not answer.get("IsTruncated") or not token:
                return keys

    def get(self, key: str) -> bytes | None:
        answer = self._call("read", "get_object", Key=self.prefix + key)
        if answer is None:
            return None
        body: bytes = answer["Body"].read()
        return body

    def put(self, key: str, body: bytes) -> None:
        self._call("write", "put_object", Key=self.prefix + key, Body=body)

    def delete(self, key: str) -> None:
        self._call("delete", "delete_object", Key=self.prefix + key)

    # ---- the checks made before anything runs ----------------------------------------------
    def _explain(self, status: int, code: str, what: str) -> str:
        code = shown(code)
        where = f"bucket {self.bucket} at {self.endpoint}"
        if code == "NoSuchBucket" or (status == 404 and what == "list"):
            return (
                f"PULUMI_BACKEND_URL names bucket {self.bucket}, which does not exist at {self.endpoint}: create "
                "it (state is never put in a bucket this tool makes itself) or correct the bucket name"
            )
        whose = f"profile {self.profile}" if self.profile else "AWS_ACCESS_KEY_ID"
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "ExpiredToken"):
            return (
                f"the S3 endpoint {self.endpoint} refused the credentials ({code}): set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for short-lived keys), or the profile in AWS_PROFILE "
                f"or profile=, to a key pair it knows (now: {whose})"
            )
        if status == 403:
            verb = "write to" if what in ("write", "delete") else "read"
            return (
                f"the key in {whose} may not {verb} {where} ({code or 'AccessDenied'}): grant it "
                "s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on the bucket, or use a key "
                "that has them"
            )
        return f"the S3 backend ({where}) answered {status} {code} to a {what}: check PULUMI_BACKEND_URL"

    def check(self) -> None:
        """Reachable, the bucket there, the credentials accepted, and writable: each failure one
        BackendError naming the variable and the fix. The write leaves nothing behind."""
        try:
            self.list_keys(".pulumi/locks/")
            probe = f".hk3s-write-check/{uuid.uuid4()}"
            self.put(probe, b"write check")
            self.delete(probe)
        except OSError as error:  # TimeoutError included
            raise BackendError(
                f"cannot reach the S3 endpoint {self.endpoint} of PULUMI_BACKEND_URL ({shown(str(error))}): correct "
                f"endpoint= in PULUMI_BACKEND_URL (http://HOST:PORT with {ALLOW_HTTP}=1 for a server without TLS) "
                "or start the server"
            ) from None

    # ---- Pulumi's lock objects --------------------------------------------------------------
    def lock_keys(self, project: str, stack: str) -> list[str]:
        """The lock objects of one stack (project-scoped layout and the older unscoped one)."""
        keys = self.list_keys(".pulumi/locks/")
        scoped = [k for k in keys if k.rsplit("/", 3)[-3:-1] == [project, stack] and k.count("/") == 5]
        unscoped = [k for k in keys if k.count("/") == 3 and k.split("/")[2] == stack]
        return sorted(k for k in (*scoped, *unscoped) if k.endswith(".json"))

    def locks(self, project: str, stack: str) -> list[LockHolder]:
        holders = []
        for key in self.lock_keys(project, stack):
            raw = self.get(key)
            if raw is None:  # released between the listing and the read
                continue
            try:
                data = json.loads(raw)
            except ValueError:
                data = {"hostname": "unknown host"}
            pid = data.get("pid")
            holders.append(
                LockHolder(
                    user=str(data.get("username", "?")),
                    hostname=str(data.get("hostname", "?")),
                    pid=pid if isinstance(pid, int) else None,
                    # The action of an operation of this API (operator_api.backend_lock); Pulumi writes none.
                    since=str(data.get("timestamp", "")) + (f", {data['action']}" if data.get("action") else ""),
                    path=f"s3://{self.bucket}/{self.prefix}{key}",
                )
            )
        return holders

    def remove_lock(self, holder: LockHolder) -> None:
        key = holder.path.removeprefix(f"s3://{self.bucket}/").removeprefix(self.prefix)
        self.delete(key)


def s3_backend(backend_url: str, env: Mapping[str, str]) -> S3Backend | None:
    """The S3 backend of `backend_url` (env over this process's environment); None for another backend."""
    if not backend_url.startswith("s3://"):
        return None
    return S3Backend.parse(backend_url, {**os.environ, **env})
