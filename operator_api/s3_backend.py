"""A stack's state in an S3 bucket (Pulumi's DIY backend, `s3://bucket[/prefix]?...`): the
URL's parts, the checks made before anything runs, and the lock objects Pulumi writes there.

The backend URL is the one the Pulumi CLI opens with gocloud.dev's s3blob driver (the version
the CLI is built with, gocloud.dev v0.46, on the AWS SDK v2): `endpoint=` (a URL, or host:port
with `disableSSL=true` choosing http), `s3ForcePathStyle=true` (or `use_path_style=true`),
`region=`; the credentials come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, for
short-lived ones, AWS_SESSION_TOKEN. Any other query parameter the driver does not know makes
the CLI fail, so it is refused here first, by name.

Pulumi's lock: each run writes `.pulumi/locks/<org>/<project>/<stack>/<uuid>.json` with its
pid, user, host and start time, then lists the directory again and backs off when another
lock is there (pkg/backend/diy/lock.go, Lock). On a store that reads its own writes (S3 since
2020, the posix backend of a single gateway), two runs may both back off but never both go
on: that is the lock across machines. An operation of this API that makes no Pulumi run (a
reboot) takes the same lock the same way (operator_api.backend_lock). It reads the objects to
name the holder, and removes one only when an operator confirms (`unlock`).

The requests are signed here with AWS Signature Version 4 (the documented algorithm: a
canonical request, the string to sign, the derived key), to keep the API free of an AWS SDK.
Two rules keep the credentials where the operator sent them:
- No request follows a redirect. A signed request carries `authorization` and the session token
  (`x-amz-security-token`), and urllib's redirect handler copies every header to the new
  address; so a 3xx is refused, naming the endpoint and the fix (the endpoint and region that
  answer for the bucket), and nothing is sent on.
- A plain `http://` endpoint (given so, or `host:port` with `disableSSL=true`) is used only with
  HK3S_S3_ALLOW_HTTP=1: over it the key id, signatures valid for minutes, the session token and
  the state itself cross the network in clear. A server on this machine or a network the
  operator trusts (a local MinIO) is the case for it. A query parameter cannot say it: the
  Pulumi CLI refuses any it does not know.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from xml.etree import ElementTree

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
S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class BackendError(StackError):
    """The S3 backend cannot be used as given; the message names the variable and the fix.
    Nothing was changed."""


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib then raises the 3xx as an HTTPError, which `request` refuses."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_RefuseRedirects())


@dataclass(frozen=True)
class S3Backend:
    """An `s3://` backend URL and the credentials it will be opened with."""

    url: str
    bucket: str
    prefix: str
    endpoint: str  # scheme://host[:port], no trailing slash
    path_style: bool
    region: str
    access_key: str
    secret_key: str
    session_token: str

    @classmethod
    def parse(cls, url: str, env: Mapping[str, str]) -> S3Backend:
        """The backend of `url` with the credentials in `env`; BackendError when either cannot work."""
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

        if param("profile") or param("role") or _true(param("anonymous")):
            raise BackendError(
                "PULUMI_BACKEND_URL uses profile=, role= or anonymous=: this tool reads the lock and checks "
                "the bucket with the key pair in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with "
                "AWS_SESSION_TOKEN for short-lived keys); export those and drop the parameter"
            )
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
        access_key = env.get("AWS_ACCESS_KEY_ID", "")
        secret_key = env.get("AWS_SECRET_ACCESS_KEY", "")
        missing = [
            name
            for name, value in (("AWS_ACCESS_KEY_ID", access_key), ("AWS_SECRET_ACCESS_KEY", secret_key))
            if not value
        ]
        if missing:
            raise BackendError(
                f"{' and '.join(missing)} not set: the S3 backend in PULUMI_BACKEND_URL needs a key pair that may "
                "read and write its bucket; export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
                "AWS_SESSION_TOKEN for short-lived keys)"
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
        return cls(
            url=url,
            bucket=parts.hostname,
            prefix=parts.path.strip("/") + "/" if parts.path.strip("/") else "",
            endpoint=endpoint.rstrip("/"),
            path_style=path_style,
            region=region,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
        )

    # ---- requests -------------------------------------------------------------------------
    def _url_and_path(self, key: str) -> tuple[str, str, str]:
        """(base URL, host header, canonical path) of an object key ('' for the bucket)."""
        base = urllib.parse.urlsplit(self.endpoint)
        quoted_key = urllib.parse.quote(key, safe="/~")
        if self.path_style:
            path = f"/{self.bucket}/{quoted_key}" if key else f"/{self.bucket}"
            host = base.netloc
        else:
            path = f"/{quoted_key}"
            host = f"{self.bucket}.{base.netloc}"
        return f"{base.scheme}://{host}", host, path

    def request(
        self, method: str, key: str = "", query: Mapping[str, str] | None = None, body: bytes = b""
    ) -> tuple[int, bytes]:
        """One signed request: (HTTP status, body). Raises OSError when the endpoint does not answer,
        BackendError when it answers with a redirect (never followed: see the module's docstring)."""
        base, host, path = self._url_and_path(key)
        now = datetime.datetime.now(datetime.UTC)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        payload_hash = hashlib.sha256(body).hexdigest()
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted((query or {}).items())
        )
        headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
        if self.session_token:
            headers["x-amz-security-token"] = self.session_token
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            [
                method,
                path,
                canonical_query,
                "".join(f"{name}:{headers[name].strip()}\n" for name in sorted(headers)),
                signed,
                payload_hash,
            ]
        )
        scope = f"{date}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        signing_key = f"AWS4{self.secret_key}".encode()
        for part in (date, self.region, "s3", "aws4_request"):
            signing_key = hmac.new(signing_key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
        )
        url = base + path + (f"?{canonical_query}" if canonical_query else "")
        http_request = urllib.request.Request(url, data=body if method == "PUT" else None, method=method)
        for name, value in headers.items():
            if name != "host":
                http_request.add_header(name, value)
        try:
            with _OPENER.open(http_request, timeout=TIMEOUT) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            if 300 <= error.code < 400:
                location = error.headers.get("Location") or ""
                target = f" to {shown(location[:200])}" if location else ""
                raise BackendError(
                    f"the S3 endpoint {self.endpoint} of PULUMI_BACKEND_URL answered {method} with a redirect "
                    f"({error.code}{target}); signed requests are never sent on to another address: set "
                    "endpoint= (and region=) in PULUMI_BACKEND_URL to the address that serves bucket "
                    f"{self.bucket}"
                ) from None
            return error.code, error.read()

    def list_keys(self, prefix: str) -> list[str]:
        """Every object key under `prefix` (inside the URL's prefix), without the URL's prefix."""
        keys: list[str] = []
        token = ""
        while True:
            query = {"list-type": "2", "prefix": self.prefix + prefix}
            if token:
                query["continuation-token"] = token
            status, body = self.request("GET", "", query)
            if status != 200:
                raise BackendError(self._explain(status, body, "list"))
            root = ElementTree.fromstring(body)
            for item in root.iter(f"{S3_NS}Contents"):
                key = item.findtext(f"{S3_NS}Key") or ""
                keys.append(key.removeprefix(self.prefix))
            token = root.findtext(f"{S3_NS}NextContinuationToken") or ""
            if root.findtext(f"{S3_NS}IsTruncated") != "true" or not token:
                return keys

    def get(self, key: str) -> bytes | None:
        status, body = self.request("GET", self.prefix + key)
        if status == 404:
            return None
        if status != 200:
            raise BackendError(self._explain(status, body, "read"))
        return body

    def put(self, key: str, body: bytes) -> None:
        status, answer = self.request("PUT", self.prefix + key, body=body)
        if status != 200:
            raise BackendError(self._explain(status, answer, "write"))

    def delete(self, key: str) -> None:
        status, body = self.request("DELETE", self.prefix + key)
        if status not in (200, 204, 404):
            raise BackendError(self._explain(status, body, "delete"))

    # ---- the checks made before anything runs ----------------------------------------------
    def _explain(self, status: int, body: bytes, what: str) -> str:
        code = ""
        with contextlib.suppress(ElementTree.ParseError):
            code = shown(ElementTree.fromstring(body).findtext("Code") or "")
        where = f"bucket {self.bucket} at {self.endpoint}"
        if code == "NoSuchBucket" or (status == 404 and what == "list"):
            return (
                f"PULUMI_BACKEND_URL names bucket {self.bucket}, which does not exist at {self.endpoint}: create "
                "it (state is never put in a bucket this tool makes itself) or correct the bucket name"
            )
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "ExpiredToken"):
            return (
                f"the S3 endpoint {self.endpoint} refused the credentials ({code}): set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for short-lived keys) to a key pair it knows"
            )
        if status == 403:
            verb = "write to" if what in ("write", "delete") else "read"
            return (
                f"the key in AWS_ACCESS_KEY_ID may not {verb} {where} ({code or 'AccessDenied'}): grant it "
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
            status, body = self.request("PUT", self.prefix + probe, body=b"write check")
            if status != 200:
                raise BackendError(self._explain(status, body, "write"))
            self.delete(probe)
        except OSError as error:  # TimeoutError included
            reason = getattr(error, "reason", error)
            raise BackendError(
                f"cannot reach the S3 endpoint {self.endpoint} of PULUMI_BACKEND_URL ({reason}): correct "
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
