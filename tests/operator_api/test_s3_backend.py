"""An `s3://` backend URL read as the Pulumi CLI (gocloud.dev s3blob, v0.46) reads it, refused by
name where the CLI would fail or where this tool could not read the lock; the age of a Pulumi lock
from the timestamp Go writes; what the requests never do (send credentials after a redirect or in
clear without an acknowledgement) and lock fields from the bucket printed without their control
characters. The requests themselves run against a real S3 server in tests/lab/test_s3_state.py;
the redirect is checked here against two real HTTP servers on loopback (http.server), since the
lab's S3 server never redirects."""

from __future__ import annotations

import datetime
import http.server
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from operator_api.errors import LockHolder, StackBusyError
from operator_api.locks import UnlockReport, describe_age, lock_age
from operator_api.s3_backend import ALLOW_HTTP, BackendError, S3Backend

KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}
# A plain-HTTP endpoint (a local MinIO, the lab's versitygw) is used only with this acknowledgement.
PLAIN = {**KEYS, ALLOW_HTTP: "1"}


def test_the_documented_form_gives_endpoint_bucket_prefix_and_path_style() -> None:
    backend = S3Backend.parse(
        "s3://team-state/hk3s?endpoint=http://10.0.0.5:7070&s3ForcePathStyle=true&region=eu-central-1", PLAIN
    )
    assert (backend.bucket, backend.prefix, backend.endpoint) == ("team-state", "hk3s/", "http://10.0.0.5:7070")
    assert backend.path_style and backend.region == "eu-central-1"


def test_a_host_port_endpoint_takes_its_scheme_from_disable_ssl_as_pulumi_does() -> None:
    plain = S3Backend.parse("s3://b?endpoint=minio:9000&disableSSL=true&use_path_style=true&region=r", PLAIN)
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


# ---- no credentials after a redirect ------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request as its server's `answer` says and records the headers it received."""

    def _answer(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        server.received.append({name.lower(): value for name, value in self.headers.items()})
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # an upload's body, read before the answer
        status, headers, body = server.answer(self.path)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_PUT(self) -> None:
        self._answer()

    def do_DELETE(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def __init__(self, answer: Callable[[str], tuple[int, dict[str, str], bytes]]) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.answer = answer
        self.received: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    """An endpoint that redirects every request to a second server, which answers like S3 (an
    empty listing, an object) and records what it was sent."""
    listing = b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsTruncated>false</IsTruncated></ListBucketResult>'
    elsewhere = _Server(lambda path: (200, {}, listing if "list-type" in path else b"{}"))
    endpoint = _Server(lambda path: (307, {"Location": elsewhere.url + path}, b""))
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in (endpoint, elsewhere)]
    for thread in threads:
        thread.start()
    yield endpoint, elsewhere
    for server in (endpoint, elsewhere):
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("call", ["list", "get", "check"])
def test_no_credentials_follow_a_redirect(servers: tuple[_Server, _Server], call: str) -> None:
    """A redirect is refused, naming the endpoint and the fix: the signature and the session token
    were made for the endpoint in PULUMI_BACKEND_URL and go nowhere else."""
    endpoint, elsewhere = servers
    backend = S3Backend.parse(
        f"s3://team-state?endpoint={endpoint.url}&s3ForcePathStyle=true&region=r",
        {**PLAIN, "AWS_SESSION_TOKEN": "session-token"},
    )
    calls: dict[str, Callable[[], object]] = {
        "list": lambda: backend.list_keys(".pulumi/locks/"),
        "get": lambda: backend.get(".pulumi/locks/organization/hk3s/prod/1.json"),
        "check": backend.check,
    }
    refusal: BaseException | None = None
    try:
        calls[call]()
    except BackendError as error:
        refusal = error
    assert endpoint.received, "the endpoint was never asked"
    sent_on = [sorted(h.keys() & {"authorization", "x-amz-security-token"}) for h in elsewhere.received]
    assert not any(sent_on), f"credentials followed the redirect to {elsewhere.url}: {sent_on}"
    assert refusal is not None, "the redirect was followed"
    message = str(refusal)
    assert "redirect" in message and endpoint.url in message and "endpoint=" in message, message
    assert "session-token" not in message and "\n" not in message


# ---- plain HTTP only when acknowledged ----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "s3://b?endpoint=http://minio.example:9000&region=r",
        "s3://b?endpoint=minio.example:9000&disableSSL=true&region=r",
    ],
)
@pytest.mark.parametrize("token", ["", "session-token"])
def test_a_plain_http_endpoint_is_refused_unless_acknowledged(url: str, token: str) -> None:
    """Over http:// the requests (the key id, a signature good for minutes, the session token)
    and the state itself cross the network in clear: refused, naming the endpoint, https and the
    acknowledgement; with it (a local MinIO) the endpoint is used as given."""
    env = {**KEYS, "AWS_SESSION_TOKEN": token} if token else KEYS
    with pytest.raises(BackendError) as refused:
        S3Backend.parse(url, env)
    message = str(refused.value)
    assert ALLOW_HTTP in message and "https://" in message and "minio.example:9000" in message, message
    assert ("AWS_SESSION_TOKEN" in message) == bool(token), message
    assert "session-token" not in message and "\n" not in message
    for acknowledged in ("1", "yes", "true"):
        assert S3Backend.parse(url, {**env, ALLOW_HTTP: acknowledged}).endpoint == "http://minio.example:9000"
    with pytest.raises(BackendError):
        S3Backend.parse(url, {**env, ALLOW_HTTP: "0"})


# ---- lock fields printed without control characters ---------------------------------------


def test_a_lock_written_with_terminal_escapes_prints_none() -> None:
    """Whoever may write the bucket writes the lock objects: their user, host and timestamp reach
    the operator's terminal (busy, status, unlock) with every control character shown escaped."""
    holder = LockHolder(
        user="ops\x1b[2J\x1b]0;owned\x07",
        hostname="ci\r\nremoved lock of everyone",
        pid=7,
        since="2026-12-05T06:59:30Z\x9b2J\u202e",
        path="s3://team-state/.pulumi/locks/organization/hk3s/prod/\x1b[31m.json",
    )
    printed = [
        str(holder),
        str(StackBusyError("prod", [holder])),
        *UnlockReport("prod", [holder], [5.0], []).lines(),
    ]
    for text in printed:
        assert text.isprintable(), repr(text)
        assert "ops\\x1b[2J" in text, repr(text)
    assert holder.user == "ops\x1b[2J\x1b]0;owned\x07", "the record itself is kept as the bucket holds it"


# ---- the AWS credential chain (botocore) ----------------------------------------------------


@pytest.fixture
def s3_like() -> Iterator[_Server]:
    """One loopback server answering like S3 (an empty listing; an empty body, as S3's to an upload
    or a delete, to anything else), recording each request's headers."""
    listing = b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsTruncated>false</IsTruncated></ListBucketResult>'
    server = _Server(lambda path: (200, {}, listing if "list-type" in path else b""))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _key_ids(server: _Server) -> list[str]:
    """The key id each signed request named (`Credential=<key id>/<scope>`)."""
    return [h.get("authorization", "").partition("Credential=")[2].partition("/")[0] for h in server.received]


@pytest.mark.parametrize("how", ["AWS_PROFILE", "profile="])
def test_a_profile_of_the_shared_files_signs_the_requests(s3_like: _Server, tmp_path: Path, how: str) -> None:
    """A user whose access is a profile (`aws configure --profile team`) reaches the bucket the
    Pulumi CLI reaches: the profile named by AWS_PROFILE or by profile= in the URL is read from the
    shared credentials file (AWS_SHARED_CREDENTIALS_FILE) and wins over keys in the environment,
    as in the CLI's SDK. Real botocore against a loopback server that records the signatures."""
    credentials = tmp_path / "credentials"
    credentials.write_text("[team]\naws_access_key_id = AKIDTEAMPROFILE\naws_secret_access_key = team-secret\n")
    env = {
        **KEYS,
        ALLOW_HTTP: "1",
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    url = f"s3://team-state?endpoint={s3_like.url}&s3ForcePathStyle=true&region=r"
    if how == "AWS_PROFILE":
        env["AWS_PROFILE"] = "team"
    else:
        url += "&profile=team"
    backend = S3Backend.parse(url, env)
    backend.check()
    assert backend.profile == "team"
    assert _key_ids(s3_like) and set(_key_ids(s3_like)) == {"AKIDTEAMPROFILE"}, _key_ids(s3_like)


def test_a_profile_that_is_not_there_is_one_line_naming_it(tmp_path: Path) -> None:
    env = {
        ALLOW_HTTP: "1",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
    }
    with pytest.raises(BackendError) as refused:
        S3Backend.parse("s3://b?endpoint=http://127.0.0.1:9&region=r&profile=nobody", env)
    message = str(refused.value)
    assert "nobody" in message and "aws configure --profile" in message and "\n" not in message, message


def test_no_credentials_anywhere_is_one_line_naming_each_way(tmp_path: Path) -> None:
    """Neither keys in the environment nor a profile nor a role: refused before any request."""
    env = {
        ALLOW_HTTP: "1",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with pytest.raises(BackendError) as refused:
        S3Backend.parse("s3://b?endpoint=http://127.0.0.1:9&region=r", env)
    message = str(refused.value)
    assert "AWS_ACCESS_KEY_ID not set" in message and "AWS_PROFILE" in message and "\n" not in message, message


def test_the_callers_environment_is_what_the_chain_reads_and_this_process_keeps_its_own(
    s3_like: _Server, tmp_path: Path
) -> None:
    """The credentials come from the environment the caller gives (as the Pulumi CLI gets it), not
    from this process's, which is left as it was."""
    before = dict(os.environ)
    backend = S3Backend.parse(
        f"s3://b?endpoint={s3_like.url}&s3ForcePathStyle=true&region=r",
        {"AWS_ACCESS_KEY_ID": "AKIDGIVEN", "AWS_SECRET_ACCESS_KEY": "s", ALLOW_HTTP: "1", "HOME": str(tmp_path)},
    )
    backend.list_keys("")
    assert _key_ids(s3_like) == ["AKIDGIVEN"]
    assert dict(os.environ) == before
