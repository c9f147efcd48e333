"""Deployment settings: the operator API is never enabled with an empty or a well-known
bearer token, and the public S3 address is an http(s) origin."""

from __future__ import annotations

import re

import pytest

from jobsapp.settings import SettingsError, load_settings

PROXY = {"JOBSAPP_AUTH_PROXY_HEADER": "X-Forwarded-Email"}


@pytest.mark.parametrize("token", ["change-me", "CHANGEME", " secret ", "admin", "password"])
def test_a_well_known_admin_token_stops_the_process(token: str) -> None:
    with pytest.raises(SettingsError, match="JOBSAPP_ADMIN_TOKEN"):
        load_settings({"JOBSAPP_ADMIN_TOKEN": token})


@pytest.mark.parametrize("name", ["JOBSAPP_ADMIN_TOKEN", "JOBSAPP_METRICS_TOKEN"])
@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("abc1", "has 4 characters, fewer than 32"),
        ("kQ3v9-random-0a1b", "has 17 characters, fewer than 32"),
        ("ab" * 20, "has only 2 distinct characters, fewer than 10"),
    ],
)
def test_a_short_or_repetitive_shared_token_stops_the_process(
    name: str, token: str, why: str
) -> None:
    """Issue 34: JOBSAPP_ADMIN_TOKEN=abc1 was accepted; the scraper's token likewise."""
    with pytest.raises(SettingsError, match=f"^{name} {why}; set a random secret"):
        load_settings({name: token})


def test_a_token_of_32_characters_and_10_distinct_ones_is_enough() -> None:
    token = "0123456789" * 4
    assert load_settings({"JOBSAPP_METRICS_TOKEN": token}).metrics_token == token


@pytest.mark.parametrize("token", ["", "   ", "\t\n"])
def test_an_empty_admin_token_keeps_the_operator_api_off(token: str) -> None:
    assert load_settings({"JOBSAPP_ADMIN_TOKEN": token}).admin_token is None


def test_a_random_admin_token_is_kept_without_surrounding_blanks() -> None:
    settings = load_settings({"JOBSAPP_ADMIN_TOKEN": " kQ3v9-random-0a1b-7f3a9c2e5b1d8064 \n"})
    assert settings.admin_token == "kQ3v9-random-0a1b-7f3a9c2e5b1d8064"


def test_the_public_s3_url_is_optional() -> None:
    assert load_settings({}).s3_public_url is None
    url = "https://files.example.org"
    assert load_settings({"JOBSAPP_S3_PUBLIC_URL": url}).s3_public_url == url


@pytest.mark.parametrize("url", ["minio:9000", "ftp://files.example.org", "https://"])
def test_a_public_s3_url_that_is_no_http_address_stops_the_process(url: str) -> None:
    with pytest.raises(SettingsError, match="JOBSAPP_S3_PUBLIC_URL"):
        load_settings({"JOBSAPP_S3_PUBLIC_URL": url})


def test_the_providers_header_is_believed_from_the_trusted_networks_only() -> None:
    settings = load_settings(
        PROXY
        | {
            "JOBSAPP_AUTH_PROXY_TRUSTED": "10.0.0.0/8, fd00::/8",
            "JOBSAPP_OPERATORS": "Olga@Example.org,ops@example.org",
        }
    )
    assert settings.auth_proxy is not None
    assert [str(n) for n in settings.auth_proxy.trusted] == ["10.0.0.0/8", "fd00::/8"]
    assert settings.auth_proxy.operators == {"olga@example.org", "ops@example.org"}
    assert load_settings({}).auth_proxy is None


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (PROXY, "JOBSAPP_AUTH_PROXY_HEADER and JOBSAPP_AUTH_PROXY_TRUSTED go together"),
        ({"JOBSAPP_AUTH_PROXY_TRUSTED": "10.0.0.0/8"}, "go together"),
        (PROXY | {"JOBSAPP_AUTH_PROXY_TRUSTED": "10.0.0.300/8"}, "'10.0.0.300/8' is not a CIDR"),
        (
            {"JOBSAPP_AUTH_PROXY_HEADER": "X Email", "JOBSAPP_AUTH_PROXY_TRUSTED": "::1"},
            "'X Email' is not a header name",
        ),
        ({"JOBSAPP_OPERATORS": "olga@example.org"}, "JOBSAPP_AUTH_PROXY_HEADER, which is not set"),
    ],
)
def test_a_provider_half_configured_stops_the_process(env: dict[str, str], line: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(line)):
        load_settings(env)
