"""Who may do what (issue 34), against gunicorn as the Procfile runs it: identities from an
authenticating proxy's header, believed only from its address; viewers and operators;
guessing the shared token throttled per client address.

The proxy is 127.0.0.1 (the browser's address, so the browser acts as if behind it: it
sends the header the proxy would add); other clients connect from other loopback addresses
(127.0.0.2, ...), which Linux routes like 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest
from playwright.sync_api import Browser, Page
from sqlalchemy import Engine

from tests.e2e.browser import chromium
from tests.support.console_e2e import TOKEN, deployment_engine, operator_env, operator_events
from tests.support.env import SESSION
from tests.support.planted import failed_job
from tests.support.servers import RedisServer
from tests.support.webserver import Http, running_web

DATABASE = f"jobsapp_e2e_access_{SESSION}"
HEADER = "X-Forwarded-Email"
OPERATOR = "olga@example.org"
VIEWER = "vera@example.org"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, module_redis: RedisServer
) -> Iterator[dict[str, str]]:
    with operator_env(tmp_path_factory, DATABASE, module_redis) as found:
        yield found | {
            "JOBSAPP_AUTH_PROXY_HEADER": HEADER,
            "JOBSAPP_AUTH_PROXY_TRUSTED": "127.0.0.1/32",
            "JOBSAPP_OPERATORS": f"{OPERATOR.upper()}, someone@example.org",
        }


@pytest.fixture(scope="module")
def web_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-access-logs") / "web.log"


@pytest.fixture(scope="module")
def web(env: dict[str, str], web_log: Path) -> Iterator[Http]:
    with running_web(env, web_log, gunicorn=True) as client:
        yield client


@pytest.fixture(scope="module")
def db(env: dict[str, str]) -> Iterator[Engine]:
    with deployment_engine(env) as engine:
        yield engine


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


def as_user(browser: Browser, web: Http, email: str) -> Page:
    """A browser behind the proxy, signed in there as ``email``."""
    context = browser.new_context(base_url=web.base_url, extra_http_headers={HEADER: email})
    return context.new_page()


@dataclass
class Client:
    """HTTP from one loopback address, keeping the console's cookie."""

    web: Http
    source: str
    cookie: str = ""

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], str]:
        where = urlsplit(self.web.base_url)
        conn = http.client.HTTPConnection(
            where.hostname or "", where.port, timeout=30, source_address=(self.source, 0)
        )
        sent = {**(headers or {}), **({"Cookie": self.cookie} if self.cookie else {})}
        try:
            conn.request(method, path, body, sent)
            reply = conn.getresponse()
            text = reply.read().decode()
        finally:
            conn.close()
        found = {k.lower(): v for k, v in reply.getheaders()}
        if "set-cookie" in found:
            self.cookie = found["set-cookie"].split(";", 1)[0]
        return reply.status, found, text

    def form(self, path: str, fields: dict[str, str]) -> tuple[int, dict[str, str], str]:
        body = urlencode(fields).encode()
        kind = {"Content-Type": "application/x-www-form-urlencoded"}
        return self.request("POST", path, body, kind)

    def log_in(self, token: str) -> tuple[int, dict[str, str], str]:
        _, _, page = self.request("GET", "/admin/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert csrf is not None, page[:500]
        return self.form("/admin/login", {"csrf_token": csrf[1], "token": token, "name": "x"})


# ------------------------------------------------------------------------------ tests

PAGES = ("", "/jobs", "/queues", "/workers", "/scheduled", "/charts", "/replay", "/cancel")


def test_a_viewer_sees_every_page_and_every_action_is_refused(
    browser: Browser, web: Http, db: Engine
) -> None:
    job_id = failed_job(db)
    page = as_user(browser, web, VIEWER)
    for path in (*PAGES, f"/jobs/jobs/{job_id}"):
        shown = page.goto(f"/admin{path}")
        assert shown is not None
        assert shown.status == 200, path
        assert f"signed in as {VIEWER} (viewer)" in page.inner_text("header"), path
        assert "You are a viewer" in page.inner_text("#viewer"), path

    assert page.locator("#replay").count() == 0  # no form that would only be refused
    # A crafted POST carries the session's CSRF token (the login form shows it): the role,
    # not the missing form, refuses it.
    csrf = page.goto("/admin/login")
    assert csrf is not None
    token = re.search(r'name="csrf_token" value="([^"]+)"', csrf.text())
    assert token is not None
    actions = {
        f"/admin/jobs/jobs/{job_id}/replay": {},
        f"/admin/jobs/jobs/{job_id}/cancel": {},
        f"/admin/jobs/jobs/{job_id}/cancel-workflow": {},
        f"/admin/jobs/jobs/{job_id}/run-now": {},
        "/admin/flow": {"action": "pause", "kind": "queue", "name": "celery"},
        "/admin/outbox/retry": {},
        "/admin/reconcile": {"dry_run": ""},
        "/admin/replay": {"job": f"jobs:{job_id}"},
        "/admin/cancel": {"job": f"jobs:{job_id}"},
    }
    for path, extra in actions.items():
        form = {"csrf_token": token[1], "reason": "a viewer tries", **extra}
        refused = page.request.post(path, form=form, max_redirects=0)
        assert refused.status == 403, path
        assert "only an operator may act" in refused.text(), path
    api = page.request.post(
        f"/v1/admin/jobs/jobs/{job_id}/replay", data=json.dumps({"reason": "api"})
    )
    assert api.status == 403
    assert "only an operator may act" in api.json()["reason"]
    assert page.request.get("/v1/admin/jobs").status == 200
    assert operator_events(db, job_id) == []
    page.context.close()


def test_an_operators_replay_is_audited_under_the_providers_identity(
    browser: Browser, web: Http, db: Engine
) -> None:
    job_id = failed_job(db)
    # The provider's spelling varies; the audit trail keeps one actor per person.
    page = as_user(browser, web, OPERATOR.title())
    page.goto(f"/admin/jobs/jobs/{job_id}")
    assert f"signed in as {OPERATOR} (operator)" in page.inner_text("header")
    assert page.locator("#viewer").count() == 0

    page.fill("#replay input[name=reason]", "upstream fixed")
    page.click("#replay button")

    assert "Replayed: attempt 2 is queued" in page.inner_text(".flash.ok")
    assert operator_events(db, job_id) == [("replay", f"operator:{OPERATOR}", "upstream fixed")]
    page.context.close()


def test_a_typed_name_is_not_audited_once_a_provider_is_configured(web: Http, db: Engine) -> None:
    job_id = failed_job(db)
    body = json.dumps({"reason": "from a script", "actor": "someone-else"}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    status, _, _ = Client(web, "127.0.0.4").request(
        "POST", f"/v1/admin/jobs/jobs/{job_id}/replay", body, headers
    )
    assert status == 200
    assert operator_events(db, job_id) == [("replay", "operator:admin-token", "from a script")]


@pytest.mark.parametrize("path", ["/admin", "/v1/admin/jobs"])
def test_a_forged_identity_header_from_an_untrusted_address_is_refused(
    web: Http, web_log: Path, path: str
) -> None:
    status, _, text = Client(web, "127.0.0.2").request("GET", path, headers={HEADER: OPERATOR})

    assert status == 403
    assert "127.0.0.2 is not within JOBSAPP_AUTH_PROXY_TRUSTED" in text
    assert f"refused {HEADER} from 127.0.0.2: not a trusted proxy" in web_log.read_text()


def test_wrong_logins_are_answered_429_and_the_right_token_works_from_another_client(
    web: Http, web_log: Path
) -> None:
    guesser = Client(web, "127.0.0.5")
    answers = []
    for n in range(30):
        status, headers, _ = guesser.log_in(f"guess-{n}-{uuid.uuid4().hex}")
        answers.append((status, headers.get("retry-after")))

    # Five failures are free; the sixth is answered too, and starts the address's wait.
    assert answers[:6] == [(401, None)] * 6
    throttled = [n for n, (status, _) in enumerate(answers) if status == 429]
    assert min(throttled, default=30) < 29, answers
    assert all(int(after or 0) >= 1 for status, after in answers if status == 429)
    # The guesser's address waits, whatever it sends; another client's right token works.
    assert guesser.log_in(TOKEN)[0] == 429
    operator = Client(web, "127.0.0.6")
    status, headers, _ = operator.log_in(TOKEN)
    assert (status, headers["location"]) == (303, "/admin")
    assert operator.request("GET", "/admin")[0] == 200
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert Client(web, "127.0.0.6").request("GET", "/v1/admin/jobs", headers=bearer)[0] == 200
    # Each failure logged once, with the address and never the token.
    logged = web_log.read_text()
    failures = re.findall(r"admin login refused: wrong token from 127\.0\.0\.5 ", logged)
    assert len(failures) == sum(1 for status, _ in answers if status == 401)
    assert "guess-" not in logged


def test_wrong_bearer_tokens_are_answered_429(web: Http) -> None:
    guesser = Client(web, "127.0.0.7")
    statuses = [
        guesser.request("GET", "/v1/admin/jobs", headers={"Authorization": f"Bearer g{n:040d}"})[0]
        for n in range(10)
    ]
    assert statuses[:5] == [401] * 5
    assert 429 in statuses
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert guesser.request("GET", "/v1/admin/jobs", headers=right)[0] == 429


def test_a_logged_out_cookie_replayed_is_refused(web: Http) -> None:
    operator = Client(web, "127.0.0.8")
    assert operator.log_in(TOKEN)[0] == 303
    status, _, page = operator.request("GET", "/admin")
    assert status == 200
    saved = operator.cookie
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf is not None
    assert operator.form("/admin/logout", {"csrf_token": csrf[1]})[0] == 303

    replayed = Client(web, "127.0.0.8", cookie=saved)
    status, headers, _ = replayed.request("GET", "/admin")
    assert (status, headers["location"]) == (302, "/admin/login?next=/admin?")
