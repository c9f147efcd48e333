"""The error scrubber: what it masks, what it leaves readable, and its invariants."""

from __future__ import annotations

import itertools
import string
import time

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from jobsapp.lifecycle.rules.scrub import (
    MASK,
    TRUNCATION_MARK,
    describe_exception,
    known_secrets_from_env,
    scrub,
)

SECRET = "Zq7xW2pL9vK4"


# --- credentials in URLs -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"postgresql+psycopg2://jobs:{SECRET}@db:5432/jobs",
            "postgresql+psycopg2://jobs:***@db:5432/jobs",
        ),
        (f"redis://default:{SECRET}@cache:6379/0", "redis://default:***@cache:6379/0"),
        (f"redis://:{SECRET}@cache:6379/0", "redis://:***@cache:6379/0"),
        (f"amqp://guest:{SECRET}@rabbit:5672//", "amqp://guest:***@rabbit:5672//"),
        (f"pyamqp://guest:{SECRET}@rabbit//", "pyamqp://guest:***@rabbit//"),
        (f"https://user:{SECRET}@example.com/x", "https://user:***@example.com/x"),
        (f"s3://AKID:{SECRET}@bucket/key.png", "s3://AKID:***@bucket/key.png"),
    ],
)
def test_url_password_is_masked_and_the_rest_kept(text: str, expected: str) -> None:
    assert scrub(f"cannot connect to {text}: timeout") == f"cannot connect to {expected}: timeout"


def test_url_password_with_raw_at_sign_is_masked_whole() -> None:
    assert scrub("redis://:p@ss@cache:6379/0") == "redis://:***@cache:6379/0"


def test_url_password_masking_stops_at_the_path() -> None:
    # An "@" later in the query must not make the host disappear.
    text = "https://u:pw@host/p?email=a@b.com"
    assert scrub(text) == "https://u:***@host/p?email=a@b.com"


def test_percent_encoded_url_password_is_masked() -> None:
    assert scrub("postgresql://u:p%40ss%2Fw@h/db") == "postgresql://u:***@h/db"


@pytest.mark.parametrize(
    "text",
    [
        "redis://cache:6379/0",
        "https://user@example.com/path",
        "s3://bucket/attachments/key.png",
        "http://host:8080/x?y=a@b",
    ],
)
def test_urls_without_password_are_unchanged(text: str) -> None:
    assert scrub(text) == text


# --- signed query strings ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "X-Amz-Signature",
        "X-Amz-Credential",
        "X-Amz-Security-Token",
        "Signature",
        "AWSAccessKeyId",
        "sig",
        "token",
        "access_token",
        "api_key",
        "apikey",
        "key",
        "password",
        "secret",
        "x-amz-signature",
        "KEY",
    ],
)
def test_signed_query_parameter_is_masked(name: str) -> None:
    text = f"GET https://b.s3.amazonaws.com/k.png?a=1&{name}={SECRET}&X-Amz-Date=1 -> 403"
    assert scrub(text) == f"GET https://b.s3.amazonaws.com/k.png?a=1&{name}=***&X-Amz-Date=1 -> 403"


def test_presigned_url_keeps_non_secret_parameters() -> None:
    text = (
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20240101%2Fus-east-1%2Fs3%2Faws4_request"
        f"&X-Amz-Date=20240101T000000Z&X-Amz-Expires=900&X-Amz-Signature={SECRET}"
    )
    assert scrub(text) == (
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
        "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=900&X-Amz-Signature=***"
    )


def test_html_escaped_query_separator_is_understood() -> None:
    assert scrub(f"href=/d?x=1&amp;sig={SECRET}") == "href=/d?x=1&amp;sig=***"


# --- NAME=value pairs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"AWS_SECRET_ACCESS_KEY={SECRET}", "AWS_SECRET_ACCESS_KEY=***"),
        ("aws_access_key_id=AKIAIOSFODNN7EXAMPLE", "aws_access_key_id=***"),
        (f"password: {SECRET}", "password: ***"),
        (f"db passwd={SECRET} host=db", "db passwd=*** host=db"),
        (f"JOBS_ADMIN_TOKEN = {SECRET}", "JOBS_ADMIN_TOKEN = ***"),
        (f"--api-key={SECRET} --verbose", "--api-key=*** --verbose"),
        (f"spring.datasource.password={SECRET}", "spring.datasource.password=***"),
        (f"X-Amz-Security-Token: {SECRET}", "X-Amz-Security-Token: ***"),
        (f'{{"token": "{SECRET}", "user": "u"}}', '{"token": "***", "user": "u"}'),
        (f"{{'password': '{SECRET}', 'port': 5432}}", "{'password': '***', 'port': 5432}"),
        (f'"client_secret":"{SECRET}"', '"client_secret":"***"'),
        # JSON inside a JSON string, as in a logged request body.
        (f'{{\\"password\\": \\"{SECRET}\\"}}', '{\\"password\\": \\"***\\"}'),
        # A value cut off by an upstream limit before its closing quote.
        (f'{{"token": "{SECRET}', '{"token": "***'),
        (f"token: Bearer {SECRET}", "token: Bearer ***"),
        # Labels in front of a value are masked with it: the secret may be either.
        (f"token: password: {SECRET}", "token: ***"),
        (f"BEARER password: {SECRET}", "BEARER ***"),
        (f"token: Bearer password: {SECRET}", "token: Bearer ***"),
        (f"password: {SECRET}Passwd : tail", "password: ***"),
        ("password=MyPassword=1", "password=***"),
        # Postgres unique-violation detail.
        (f"Key (api_token)=({SECRET}) already exists.", "Key (api_token)=*** already exists."),
    ],
)
def test_secret_named_value_is_masked(text: str, expected: str) -> None:
    assert scrub(text) == expected


def test_unquoted_value_is_masked_up_to_whitespace_including_punctuation() -> None:
    # Trade-off: a comma may be part of a password, so it goes with the value.
    assert scrub(f"password={SECRET}, user=bob") == "password=*** user=bob"


# --- Authorization, Bearer, Basic ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Authorization: Bearer {SECRET}", "Authorization: Bearer ***"),
        ("authorization: basic dXNlcjpwYXNz", "authorization: basic ***"),
        (f"Proxy-Authorization: {SECRET}", "Proxy-Authorization: ***"),
        (
            f"{{'Authorization': 'Bearer {SECRET}', 'Host': 'h'}}",
            "{'Authorization': 'Bearer ***', 'Host': 'h'}",
        ),
        (
            # SigV4 spans spaces and commas: the whole rest of the line goes.
            "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20240101/"
            f"us-east-1/s3/aws4_request, SignedHeaders=host, Signature={SECRET}\nnext line",
            "Authorization: AWS4-HMAC-SHA256 ***\nnext line",
        ),
        (f"sent Bearer {SECRET}.x-y_z~ to api", "sent Bearer *** to api"),
        ("Bearer xxx", "Bearer ***"),
        ("sent Basic dXNlcjpwYXNz to proxy", "sent Basic *** to proxy"),
        ("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==", "Basic ***"),
    ],
)
def test_authorization_credentials_are_masked(text: str, expected: str) -> None:
    assert scrub(text) == expected


def test_basic_as_an_english_word_is_kept() -> None:
    text = "Basic validation failed; WWW-Authenticate: Basic realm=jobs"
    assert scrub(text) == text


# --- AWS key ids, JWTs, private keys -------------------------------------------------------


@pytest.mark.parametrize("prefix", ["AKIA", "ASIA"])
def test_aws_access_key_id_is_masked_anywhere(prefix: str) -> None:
    assert (
        scrub(f"signing with {prefix}IOSFODNN7EXAMPLE failed") == f"signing with {prefix}*** failed"
    )


@pytest.mark.parametrize(
    "text", ["AKIAIOSFODNN7EXAMPL", "AKIAIOSFODNN7EXAMPLEX", "XAKIAIOSFODNN7EXAMPLE"]
)
def test_near_miss_key_ids_are_kept(text: str) -> None:
    assert scrub(text) == text


def test_jwt_is_masked() -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJl-_x"
    assert scrub(f"rejected {jwt} (expired)") == "rejected *** (expired)"


def test_pem_private_key_is_masked() -> None:
    text = (
        "bad key -----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nabc\n"
        "-----END RSA PRIVATE KEY----- loaded"
    )
    assert scrub(text) == (
        "bad key -----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY----- loaded"
    )


# --- known secrets -------------------------------------------------------------------------


def test_known_secrets_are_masked_even_when_bare() -> None:
    assert scrub("admin hunter2 said hunter2", secrets=("hunter2",)) == "admin *** said ***"


def test_known_secret_is_masked_in_percent_encoded_form() -> None:
    assert scrub("GET /x?t=a%2Fb%2Bc", secrets=("a/b+c",)) == "GET /x?t=***"


def test_known_secret_containing_another_is_masked_whole() -> None:
    assert scrub("value abcdefgh", secrets=("abcd", "abcdefgh")) == "value ***"


def test_known_secret_fixes_what_patterns_cannot_see() -> None:
    # A raw "/" ends the URL authority, so the pattern alone would miss this password.
    text = "postgresql://u:pa/ss99@h/db"
    assert scrub(text, secrets=("pa/ss99",)) == "postgresql://u:***@h/db"


def test_too_short_known_secrets_are_ignored() -> None:
    assert scrub("abc and the rest", secrets=("abc", "")) == "abc and the rest"


def test_known_secrets_from_env_collects_secret_values_and_url_passwords() -> None:
    environ = {
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "JOBS_ADMIN_TOKEN": " tok-123456 ",
        "DB_PASSWORD": "short",
        "STRIPE_KEY": "sk_live_abcdef",
        "DATABASE_URL": "postgresql+psycopg2://jobs:p%40ssword1@db/jobs",
        "CELERY_BROKER_URL": "amqp://u:first-pw1@h1//;amqp://u:second-pw2@h2//",
        "REDIS_URL": "redis://cache:6379/0",
        "REDIS_KEY_PREFIX": "jobsapp",
        "MONKEY_PATCH": "gevent-all",
        "HOME": "/root/secret-home",
    }
    assert known_secrets_from_env(environ) == (
        "first-pw1",
        "p%40ssword1",
        "p@ssword1",
        "second-pw2",
        "sk_live_abcdef",
        "tok-123456",
        "wJalrXUtnFEMI/K7MDENG",
    )


def test_an_access_key_id_is_no_secret_of_the_environment() -> None:
    """A word-like id (MinIO's, this project's test S3) would mask module names in every log
    line; a real AWS key id is masked by its pattern, whatever the environment says."""
    secrets = known_secrets_from_env({"AWS_ACCESS_KEY_ID": "jobsapp"})
    assert secrets == ()
    text = "jobsapp.attachments.process signed with AKIAIOSFODNN7EXAMPLE"
    assert scrub(text, secrets=secrets) == "jobsapp.attachments.process signed with AKIA***"


# --- mixed text and false positives --------------------------------------------------------


def test_mixed_text_loses_every_secret_and_keeps_the_context() -> None:
    text = (
        "upload of attachment:42 failed: PUT "
        f"https://b.s3.amazonaws.com/a/42.png?X-Amz-Signature=sig{SECRET}&X-Amz-Date=1 -> 403; "
        f"retrying via postgresql://jobs:pw{SECRET}@db/jobs with AWS_SECRET_ACCESS_KEY=ak{SECRET} "
        f"key AKIAIOSFODNN7EXAMPLE, headers {{'Authorization': 'Bearer bt{SECRET}'}}, "
        f"admin hunter2{SECRET}"
    )
    out = scrub(text, secrets=(f"hunter2{SECRET}",))
    assert SECRET not in out
    assert "AKIAIOSFODNN7EXAMPLE" not in out
    for context in ("attachment:42", "b.s3.amazonaws.com/a/42.png", "X-Amz-Date=1", "403"):
        assert context in out
    assert "postgresql://jobs:***@db/jobs" in out
    assert "'Authorization': 'Bearer ***'" in out


@pytest.mark.parametrize(
    "text",
    [
        "key conflict on concurrency_key attachment:123",
        "token bucket empty",
        "Token bucket: empty",
        "DETAIL:  Key (concurrency_key)=(attachment:123) already exists.",
        "idempotency_key=resize:42 already enqueued",
        'FATAL:  password authentication failed for user "jobs"',
        "InvalidTokenError: token expired",
        "NoCredentialsError: Unable to locate credentials",
        "An error occurred (SignatureDoesNotMatch) when calling the PutObject operation: "
        "The request signature we calculated does not match the signature you provided.",
        "An error occurred (ExpiredToken) when calling the GetObject operation",
        "lease lost for run 7f1c: heartbeat at 12:00:03 older than 30s",
        "X-Idempotency-Key: resize-42",
        "no such key: attachments/42.png",
    ],
)
def test_ordinary_error_text_is_unchanged(text: str) -> None:
    assert scrub(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A name with a keyword is trusted even when its value is harmless.
        ("max_tokens=5", "max_tokens=***"),
        ("invalid password: too short", "invalid password: *** short"),
    ],
)
def test_accepted_false_positives(text: str, expected: str) -> None:
    assert scrub(text) == expected


# --- idempotence and truncation ------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        f"postgresql://u:{SECRET}@h/db and password={SECRET}",
        f'{{"token": "{SECRET}',
        f"Authorization: Bearer {SECRET}",
        "-----BEGIN EC PRIVATE KEY-----\nabc",
        "plain text",
    ],
)
def test_scrub_is_idempotent(text: str) -> None:
    once = scrub(text)
    assert scrub(once) == once


def test_short_text_is_not_truncated() -> None:
    text = "x" * 50
    assert scrub(text, limit=50) == text


def test_long_text_keeps_the_start_and_ends_with_the_mark() -> None:
    out = scrub("abcdefghij" * 500)
    assert len(out) == 2000
    assert out.endswith(TRUNCATION_MARK)
    assert out.startswith("abcdefghij" * 10)


def test_truncation_happens_after_masking() -> None:
    # The raw cut at 38 characters would fall inside the key id, leaving 13 characters that
    # no longer look like one.
    text = "x" * 24 + " AKIAIOSFODNN7EXAMPLE " + "y" * 100
    out = scrub(text, limit=50)
    assert out == "x" * 24 + " AKIA*** " + "y" * 5 + TRUNCATION_MARK


def test_truncation_right_after_a_label_is_stable() -> None:
    # Regression: the marker was taken for the value of the last "password:", so backing off
    # cascaded through the text down to almost nothing.
    text = "step 1 ok, step 2 ok, password: " + "x" * 200 + " then more text" * 10
    for cut in range(28, 40):  # around "password: ***"
        limit = cut + len(TRUNCATION_MARK)
        out = scrub(text, limit=limit)
        assert out.startswith("step 1 ok, step 2 ok, ")
        assert out.endswith(TRUNCATION_MARK)
        assert scrub(out, limit=limit) == out


def test_truncation_never_splits_a_mask() -> None:
    for limit in range(len(TRUNCATION_MARK), 60):
        out = scrub(f"ok password={SECRET} and then a long tail " * 3, limit=limit)
        assert len(out) <= limit
        assert scrub(out, limit=limit) == out
        assert SECRET not in out


def test_limit_below_the_mark_is_rejected() -> None:
    with pytest.raises(ValueError, match="limit"):
        scrub("text", limit=len(TRUNCATION_MARK) - 1)


@pytest.mark.parametrize(
    "text",
    [
        "token: " * 30_000,
        "Bearer " * 30_000,
        "tokentoken" * 20_000 + "=x",
        "a:" * 100_000,
        "a://" + "u:" * 100_000,
        '"password": "' * 20_000,
        "eyJ" * 100_000,
        "x" * 1_000_000,
    ],
    ids=lambda text: text[:12],
)
def test_pathological_input_is_scrubbed_quickly(text: str) -> None:
    started = time.perf_counter()
    out = scrub(text)
    assert time.perf_counter() - started < 1.0
    assert scrub(out) == out


def test_huge_input_is_cheap_and_leak_free() -> None:
    text = ("word " * 200_000) + f"password={SECRET}" + ("a." * 500_000)
    started = time.perf_counter()
    out = scrub(text)
    assert time.perf_counter() - started < 2.0
    assert out.endswith(TRUNCATION_MARK)
    assert SECRET not in out


# --- properties ----------------------------------------------------------------------------

TEMPLATES = [
    "postgresql://u:{s}@h/db",
    "redis://:{s}@cache:6379/0",
    "AWS_SECRET_ACCESS_KEY={s}",
    "https://b.s3.amazonaws.com/k?X-Amz-Signature={s}&X-Amz-Date=1",
    "Authorization: Bearer {s}",
    "Bearer {s}",
    "password: {s}",
    '{{"token": "{s}"}}',
    "GET /v1?api_key={s}",
]

secrets_text = st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=40)
# Context made of the pieces the rules key on, so labels, quotes and separators end up right
# next to the planted pair (glued into words, but separated from the pair by a space).
CONTEXT_PIECES = [
    *("password", "token", "secret", "api_key", "key", "sig", "Bearer", "Basic"),
    *("Authorization", "Error", "AKIA", "eyJ", "://", "@", "/", "?", "&", "=", ":"),
    *("'", '"', "\\", "(", ")", "-", "_", ".", ",", " ", "\n"),
]
context_text = st.lists(
    st.one_of(
        st.sampled_from(CONTEXT_PIECES),
        st.text(alphabet=string.ascii_letters + string.digits, max_size=6),
    ),
    max_size=8,
).map("".join)


@given(
    template=st.sampled_from(TEMPLATES),
    secret=secrets_text,
    before=context_text,
    after=context_text,
)
def test_planted_secret_never_survives(template: str, secret: str, before: str, after: str) -> None:
    # A secret that also occurs in the fixed text ("amazonaws") cannot be told apart.
    assume(secret not in f"{before} {template.format(s=MASK)} {after}")
    out = scrub(f"{before} {template.format(s=secret)} {after}")
    assert secret not in out


@given(
    # A secret made of "*" could be re-formed by a mask next to it.
    secret=st.text(min_size=4, max_size=30).filter(lambda s: "*" not in s),
    before=st.text(max_size=40),
    after=st.text(max_size=40),
)
def test_known_secret_never_survives(secret: str, before: str, after: str) -> None:
    assume(secret not in TRUNCATION_MARK)
    out = scrub(before + secret + after, secrets=(secret,))
    assert secret not in out


fragments = st.sampled_from(
    [t.format(s=SECRET) for t in TEMPLATES]
    + ["AKIAIOSFODNN7EXAMPLE", "Basic dXNlcjpwYXNz", "token bucket", "key:1", "\n", " ", "'", '"']
)


@given(
    parts=st.lists(st.one_of(fragments, st.text(max_size=12)), max_size=12),
    limit=st.integers(min_value=len(TRUNCATION_MARK), max_value=200),
)
def test_scrub_is_a_fixed_point(parts: list[str], limit: int) -> None:
    once = scrub("".join(parts), limit=limit)
    assert len(once) <= limit
    assert scrub(once, limit=limit) == once


# --- describe_exception --------------------------------------------------------------------


def _raise_chain() -> None:
    try:
        raise ConnectionRefusedError(f"redis://:{SECRET}@cache:6379/0 refused")
    except ConnectionRefusedError as exc:
        raise RuntimeError("broker unavailable") from exc


def test_describe_exception_has_type_message_and_scrubbed_cause() -> None:
    with pytest.raises(RuntimeError) as info:
        _raise_chain()
    assert describe_exception(info.value) == (
        "RuntimeError: broker unavailable; caused by ConnectionRefusedError: "
        "redis://:***@cache:6379/0 refused"
    )


def test_describe_exception_follows_implicit_context_unless_suppressed() -> None:
    def fail(*, suppress: bool) -> None:
        try:
            raise KeyError("attachment:1")
        except KeyError:
            if suppress:
                raise ValueError("bad payload") from None
            raise ValueError("bad payload")  # noqa: B904 - the implicit context is the point

    with pytest.raises(ValueError, match="bad payload") as implicit:
        fail(suppress=False)
    assert describe_exception(implicit.value) == (
        "ValueError: bad payload; while handling KeyError: 'attachment:1'"
    )
    with pytest.raises(ValueError, match="bad payload") as suppressed:
        fail(suppress=True)
    assert describe_exception(suppressed.value) == "ValueError: bad payload"


def test_describe_exception_stops_after_three_links_and_on_cycles() -> None:
    errors = [ValueError(f"level {i}") for i in range(6)]
    for outer, inner in itertools.pairwise(errors):
        outer.__cause__ = inner
    assert describe_exception(errors[0]) == (
        "ValueError: level 0; caused by ValueError: level 1; "
        "caused by ValueError: level 2; caused by ValueError: level 3"
    )
    errors[1].__cause__ = errors[0]
    assert describe_exception(errors[0]) == "ValueError: level 0; caused by ValueError: level 1"


def test_describe_exception_without_message_or_with_a_broken_str() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("boom")

    assert describe_exception(TimeoutError()) == "TimeoutError"
    assert describe_exception(Broken()) == "Broken: <unprintable message>"


def test_describe_exception_never_shows_frame_locals() -> None:
    def fail() -> None:
        admin_token = f"local-{SECRET}"
        raise PermissionError("forbidden" if admin_token else "")

    with pytest.raises(PermissionError) as info:
        fail()
    assert describe_exception(info.value) == "PermissionError: forbidden"


def test_describe_exception_masks_known_secrets_and_truncates() -> None:
    exc = RuntimeError(f"admin token {SECRET} rejected " + "x" * 100)
    out = describe_exception(exc, secrets=(SECRET,), limit=40)
    assert out == "RuntimeError: admin token …[truncated]"
