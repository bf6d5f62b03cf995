"""The approvals inbox (``relaykit inbox``): every waiting call of the namespace over a JSON API
and a page, against the real dev server, a real worker and the real ``relaykit inbox`` process;
the page is driven in headless Chromium (Debian's ``chromium`` through Playwright)."""

from __future__ import annotations

import asyncio
import base64
import os
import queue
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from relaykit import Agent, RunHandle, start_run, tool
from relaykit.devserver import DEFAULT_UI_URL, DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import eventually, scripted_model, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class Inbox:
    url: str
    token: str
    sign_in_link: str
    proc: subprocess.Popen[str]

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}


def _env(address: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_INBOX"))}
    env.update(
        TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE="default", NO_COLOR="1", COLUMNS="300", **extra
    )
    return env


def _lines(stream: Any) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def start_inbox(address: str, token: str | None, **env: str) -> Inbox:
    """``relaykit inbox`` on a free port, once it has printed where it listens."""
    if token is not None:
        env["RELAYKIT_INBOX_AUTH"] = f"Bearer {token}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "inbox", "--port", "0"],
        cwd=REPO_ROOT,
        env=_env(address, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = _lines(proc.stderr)
    seen: list[str] = []
    while not seen or (
        token is not None and not any(line.startswith("sign in: ") for line in seen)
    ):
        try:
            seen.append(lines.get(timeout=30))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"relaykit inbox did not start: {seen}") from None
    assert seen[0].startswith("inbox on "), seen
    url = seen[0].split()[2]
    link = next((line for line in seen if line.startswith("sign in: ")), "")[len("sign in: ") :]
    return Inbox(url=url, token=token or "", sign_in_link=link, proc=proc)


def stop_inbox(inbox: Inbox) -> None:
    inbox.proc.terminate()
    inbox.proc.wait(timeout=15)


@pytest.fixture(scope="module")
def inbox(temporal_server: DevServer) -> Iterator[Inbox]:
    """One ``relaykit inbox`` process with a token, on a free port, for this module."""
    started = start_inbox(temporal_server.address, secrets.token_urlsafe(16))
    try:
        yield started
    finally:
        stop_inbox(started)


def desks(server: ScriptedModelServer, invocations: list[str]) -> tuple[Agent, Agent, Agent]:
    """Three agents whose calls wait for a person: two at the root, one inside a child run."""

    @tool(needs_approval=True)
    def refund(order_id: str, amount: int) -> str:
        """Refund an order."""
        invocations.append(f"refund {order_id}")
        return f"refunded {amount} for {order_id}"

    @tool(needs_approval=True)
    def restart_service(name: str) -> str:
        """Restart a service."""
        invocations.append(f"restart {name}")
        return f"restarted {name}"

    @tool(needs_approval=True)
    def wire_money(amount: int) -> str:
        """Wire money."""
        invocations.append(f"wire {amount}")
        return f"wired {amount}"

    def answering(first: Any, done: str) -> Any:
        return lambda req: text(f"{done}: {req.tool_results[-1]}") if req.tool_results else first

    models = [scripted_model(server) for _ in range(4)]
    server.respond(models[0].name, answering(call("refund", order_id="A-1", amount=30), "billing"))
    server.respond(models[1].name, answering(call("restart_service", name="db"), "ops"))
    server.respond(models[2].name, answering(call("wire_money", amount=70), "payments"))
    server.respond(models[3].name, answering(call("ask_payments_desk", input="wire 70"), "front"))
    billing = Agent(name="billing_desk", model=models[0], tools=[refund])
    ops = Agent(name="ops_desk", model=models[1], tools=[restart_service])
    payments = Agent(name="payments_desk", model=models[2], tools=[wire_money])
    front = Agent(name="front_desk", model=models[3], tools=[payments.as_tool()])
    return billing, ops, front


async def pending_of(
    http: httpx.AsyncClient, inbox: Inbox, run_ids: set[str]
) -> list[dict[str, Any]]:
    response = await http.get(f"{inbox.url}/api/pending", headers=inbox.auth)
    assert response.status_code == 200, response.text
    # Child runs' ids start with their root's: a child's call listed on its own would show here.
    return [item for item in response.json() if item["run_id"].startswith(tuple(run_ids))]


async def start_desks(
    client: Client, task_queue: str, agents: tuple[Agent, Agent, Agent]
) -> list[RunHandle]:
    billing, ops, front = agents
    return [
        await start_run(client, billing, "refund A-1", task_queue=task_queue),
        await start_run(client, ops, "restart the db", task_queue=task_queue),
        await start_run(client, front, "wire 70", task_queue=task_queue),
    ]


async def test_inbox_lists_calls_of_several_agents_and_a_childs_call_once_and_decides_them_over_the_api(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, inbox: Inbox
) -> None:
    # GET /api/pending lists each waiting call once (a child's under its root run, with its run
    # path); POST /api/decide answers them with 200, 404, 409 and 400 as documented.
    invocations: list[str] = []
    agents = desks(model_server, invocations)
    async with serving(client, list(agents)) as worker, httpx.AsyncClient(timeout=30) as http:
        billing, ops, front = await start_desks(client, worker.task_queue, agents)
        ids = {billing.id, ops.id, front.id}

        async def three() -> list[dict[str, Any]] | None:
            items = await pending_of(http, inbox, ids)
            return items if len(items) == 3 else None

        listed = await eventually(three, "three waiting calls")
        items = {item["run_id"]: item for item in listed}
        assert set(items) == ids
        assert {(i["agent"], i["tool"], tuple(i["run_path"])) for i in items.values()} == {
            ("billing_desk", "refund", ("billing_desk",)),
            ("ops_desk", "restart_service", ("ops_desk",)),
            ("payments_desk", "wire_money", ("front_desk", "payments_desk")),
        }
        assert items[billing.id]["arguments"] == {"order_id": "A-1", "amount": 30}
        assert items[front.id]["arguments"] == {"amount": 70}
        child_id = items[front.id]["owner_run_id"]
        assert child_id != front.id and child_id.startswith(front.id)
        for item in items.values():
            at = datetime.fromisoformat(item["requested_at"])
            assert at.utcoffset() is not None and at.utcoffset().total_seconds() == 0
            assert abs((datetime.now(UTC) - at).total_seconds()) < 600
            assert item["ui_url"].endswith(f"/namespaces/default/workflows/{item['run_id']}")

        async def post(body: Any) -> httpx.Response:
            return await http.post(f"{inbox.url}/api/decide", json=body, headers=inbox.auth)

        refund_call = items[billing.id]["call_id"]
        assert (
            await post({"run_id": billing.id, "call_id": "nope", "approve": True})
        ).status_code == 404
        assert (
            await post({"run_id": "no-such-run", "call_id": refund_call, "approve": True})
        ).status_code == 404
        for malformed in (
            {"run_id": billing.id, "call_id": refund_call},
            {"run_id": billing.id, "call_id": refund_call, "approve": "yes"},
            ["not", "an", "object"],
        ):
            response = await post(malformed)
            assert response.status_code == 400, malformed
            assert "error" in response.json()
        not_json = await http.post(
            f"{inbox.url}/api/decide",
            content=b"{",
            headers={**inbox.auth, "content-type": "application/json"},
        )
        assert not_json.status_code == 400

        approved = await post({"run_id": billing.id, "call_id": refund_call, "approve": True})
        assert approved.status_code == 200, approved.text
        assert approved.json()["tool"] == "refund" and approved.json()["approved"] is True
        assert (
            await post({"run_id": billing.id, "call_id": refund_call, "approve": True})
        ).status_code == 409
        rejected = await post(
            {
                "run_id": ops.id,
                "call_id": items[ops.id]["call_id"],
                "approve": False,
                "reason": "not during business hours",
            }
        )
        assert rejected.status_code == 200, rejected.text
        child = await post(
            {"run_id": front.id, "call_id": items[front.id]["call_id"], "approve": True}
        )
        assert child.status_code == 200, child.text

        results = [await handle.result() for handle in (billing, ops, front)]
        closed = await post({"run_id": billing.id, "call_id": refund_call, "approve": True})
        assert closed.status_code == 409 and "closed" in closed.json()["error"]
        assert await pending_of(http, inbox, ids) == []
    assert sorted(invocations) == ["refund A-1", "wire 70"]
    assert results[0].output.startswith("billing: refunded 30")
    assert "not during business hours" in results[1].output
    assert results[2].output.startswith("front: ")


async def test_calls_selected_in_the_inbox_are_answered_together_each_checked_and_recorded_with_its_author(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, inbox: Inbox
) -> None:
    # "Approve selected" (the API and the page's form): each ticked call checked against what
    # its run waits for, answered by a signal carrying who decided; one outcome per call.
    import re

    from relaykit.authors import current_user

    invocations: list[str] = []
    agents = desks(model_server, invocations)
    async with serving(client, list(agents)) as worker, httpx.AsyncClient(timeout=30) as http:
        billing, ops, front = await start_desks(client, worker.task_queue, agents)
        ids = {billing.id, ops.id, front.id}

        async def three() -> list[dict[str, Any]] | None:
            items = await pending_of(http, inbox, ids)
            return items if len(items) == 3 else None

        items = {item["run_id"]: item for item in await eventually(three, "three waiting calls")}

        async def post(body: Any) -> httpx.Response:
            url = f"{inbox.url}/api/decide-selected"
            return await http.post(url, json=body, headers=inbox.auth)

        for malformed in (
            {"calls": [], "approve": True},
            {"calls": [{"run_id": billing.id}], "approve": True},
            {"calls": [{"run_id": billing.id, "call_id": "c"}], "approve": "yes"},
            {"calls": [{"run_id": billing.id, "call_id": "c"}], "approve": True, "by": "x" * 201},
        ):
            response = await post(malformed)
            assert response.status_code == 400, malformed
            assert "error" in response.json()
        picks = [
            {"run_id": billing.id, "call_id": items[billing.id]["call_id"]},
            {"run_id": front.id, "call_id": items[front.id]["call_id"]},  # a child's call
            {"run_id": billing.id, "call_id": items[ops.id]["call_id"]},  # ops' call, wrong run
            {"run_id": "no-such-run", "call_id": "call_x"},
        ]
        response = await post({"calls": picks, "approve": True, "by": "dora"})
        assert response.status_code == 200, response.text
        outcomes = response.json()
        assert [(o["run_id"], o["call_id"], o["status"]) for o in outcomes] == [
            (p["run_id"], p["call_id"], status)
            for p, status in zip(
                picks, ["answered", "answered", "not_waiting", "not_waiting"], strict=True
            )
        ]
        results = [await billing.result(), await front.result()]
        again = await post({"calls": picks[:1], "approve": True})
        assert again.json()[0]["status"] == "not_waiting"  # closed now: nothing sent

        # The page's form: the ops call ticked, rejected with a reason, by the inbox's user.
        page = await http.get(f"{inbox.url}/", headers=inbox.auth)
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf is not None
        picked = re.search(rf'name="pick" form="selected" value="([^"]*{ops.id}[^"]*)"', page.text)
        assert picked is not None
        form = await http.post(
            f"{inbox.url}/decide-selected",
            headers=inbox.auth,
            data={
                "csrf": csrf.group(1),
                "pick": picked.group(1).replace("&quot;", '"'),
                "decision": "reject",
                "reason": "not during business hours",
            },
        )
        assert form.status_code == 303
        assert "rejected+1+of+1+selected+call" in form.headers["location"].replace("%20", "+")
        ops_result = await ops.result()
        answers = {
            handle.id: [e.data for e in await handle.events() if e.kind == "approval_answered"]
            for handle in (billing, ops, front)
        }
    assert sorted(invocations) == ["refund A-1", "wire 70"]
    assert results[0].output.startswith("billing: refunded 30")
    assert results[1].output.startswith("front: ")
    assert "not during business hours" in ops_result.output
    assert [a["by"] for a in answers[billing.id]] == ["dora"]
    assert [a["by"] for a in answers[front.id]] == ["dora"]
    assert [(a["by"], a["approved"]) for a in answers[ops.id]] == [(current_user(), False)]


async def test_every_inbox_route_refuses_requests_without_the_token(inbox: Inbox) -> None:
    # With RELAYKIT_INBOX_AUTH set: no header, a wrong header or a forged cookie gets 401.
    async with httpx.AsyncClient(timeout=10, follow_redirects=False) as http:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"cookie": "relaykit_inbox=forged"}):
            for method, path in (
                ("GET", "/"),
                ("GET", "/api/pending"),
                ("GET", "/api/budgets"),
                ("POST", "/api/decide"),
                ("POST", "/decide"),
                ("POST", "/api/decide-selected"),
                ("POST", "/decide-selected"),
                ("GET", "/nowhere"),
                ("GET", "/decide"),
            ):
                response = await http.request(
                    method,
                    f"{inbox.url}{path}",
                    headers=headers,
                    json={"run_id": "r", "call_id": "c", "approve": True},
                )
                assert response.status_code == 401, (method, path, headers)
        page = await http.get(f"{inbox.url}/")
        assert 'name="token"' in page.text  # the 401 page is the sign-in form
        wrong = await http.post(f"{inbox.url}/signin", data={"token": "wrong"})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        right = await http.post(f"{inbox.url}/signin", data={"token": inbox.token})
        assert right.status_code == 303
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert inbox.token not in cookie
        signed = await http.get(f"{inbox.url}/", headers={"cookie": cookie.split(";")[0]})
        assert (
            signed.status_code == 200
            and "frame-ancestors 'none'" in signed.headers["content-security-policy"]
        )
        # A form post with the cookie but without the page's CSRF token is refused.
        forged = await http.post(
            f"{inbox.url}/decide",
            headers={"cookie": cookie.split(";")[0]},
            data={"run_id": "r", "call_id": "c", "decision": "approve"},
        )
        assert forged.status_code == 403


async def test_an_inbox_with_the_runs_codec_shows_encrypted_arguments_and_one_without_says_it_cannot(  # noqa: E501
    model_server: ScriptedModelServer, temporal_server: DevServer, inbox: Inbox
) -> None:
    # Arguments are decoded with RELAYKIT_CODEC; an inbox without the key names the run as
    # unreadable instead of dropping it. A tokenless inbox answers loopback Host names only.
    from relaykit import connect
    from relaykit.codecs.aes import AesGcmCodec

    key = base64.b64encode(secrets.token_bytes(32)).decode()
    encrypted = await connect(temporal_server.address, codec=AesGcmCodec(key))
    invocations: list[str] = []
    billing, _, _ = desks(model_server, invocations)
    plain = start_inbox(
        temporal_server.address,
        None,
        RELAYKIT_CODEC="relaykit.codecs.aes:AesGcmCodec",
        RELAYKIT_CODEC_KEY=key,
    )
    try:
        async with serving(encrypted, billing) as worker, httpx.AsyncClient(timeout=30) as http:
            handle = await start_run(encrypted, billing, "refund A-1", task_queue=worker.task_queue)

            async def listed() -> list[dict[str, Any]]:
                response = await http.get(f"{plain.url}/api/pending")
                assert response.status_code == 200, response.text
                return [item for item in response.json() if item["run_id"] == handle.id]

            [item] = await eventually(listed, "the encrypted run's call")
            assert item["arguments"] == {"order_id": "A-1", "amount": 30}

            async def named_unreadable() -> bool:
                page = await http.get(f"{inbox.url}/", headers=inbox.auth)
                return "could not be read" in page.text and handle.id in page.text

            await eventually(named_unreadable, "the run named as unreadable without the key")
            rebound = await http.get(f"{plain.url}/api/pending", headers={"host": "evil.example"})
            assert rebound.status_code == 421
            decided = await http.post(
                f"{plain.url}/api/decide",
                json={
                    "run_id": handle.id,
                    "call_id": item["call_id"],
                    "approve": False,
                    "reason": "no",
                },
            )
            assert decided.status_code == 200, decided.text
            result = await handle.result()
    finally:
        stop_inbox(plain)
    assert invocations == [] and "no" in result.output


async def test_inbox_says_temporal_is_unreachable_with_a_503_page_and_json_and_one_log_line(
    tmp_path: Any,
) -> None:
    # Temporal stops while the inbox runs: the page says so and retries by itself, the API
    # answers a JSON 503, and the log has one line per request, no traceback.
    server = DevServer(port=0, headless=True, in_memory=True).start()
    log = tmp_path / "inbox.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaykit.cli", "inbox", "--port", "0"],
            cwd=REPO_ROOT,
            env=_env(server.address),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    try:
        deadline = time.monotonic() + 30
        while "inbox on " not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            await asyncio.sleep(0.1)
        url = log.read_text().split("inbox on ", 1)[1].split()[0]
        server.stop()
        async with httpx.AsyncClient(timeout=60) as http:
            page = await http.get(f"{url}/")
            api = await http.get(f"{url}/api/pending")
            decided = await http.post(
                f"{url}/api/decide", json={"run_id": "r", "call_id": "c", "approve": True}
            )
            logged = log.read_text()
            port = int(server.address.rsplit(":", 1)[1])
            back = DevServer(port=port, headless=True, in_memory=True).start()
            try:  # Temporal back on the same address: the inbox answers again, not restarted

                async def answers() -> bool:
                    return (await http.get(f"{url}/api/pending")).status_code == 200

                await eventually(answers, "the inbox to answer once Temporal is back", 60)
            finally:
                back.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        server.stop()
    unreachable = f"Temporal is unreachable at {server.address}"
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
    assert unreachable in page.text and "retries by itself" in page.text
    assert '<meta http-equiv="refresh"' in page.text
    for response in (api, decided):
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        body = response.json()
        assert body["error"].startswith(unreachable) and body["retry_after"] == 5
    said = logged.strip().splitlines()[1:]
    assert "Traceback" not in log.read_text()
    assert [line.split(":", 1)[0] for line in said] == [
        "GET /",
        "GET /api/pending",
        "POST /api/decide",
    ], said
    assert all(unreachable in line and line.endswith("answered 503") for line in said)


def test_inbox_refuses_to_listen_off_loopback_without_a_token(temporal_server: DevServer) -> None:
    # Anyone who reaches an unguarded inbox could approve tool calls: one line, exit status 1.
    done = subprocess.run(
        [sys.executable, "-m", "relaykit.cli", "inbox", "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO_ROOT,
        env=_env(temporal_server.address),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(
        "error: refusing to serve the inbox on 0.0.0.0 without RELAYKIT_INBOX_AUTH"
    )
    assert all("Traceback" not in line for line in lines)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed here when missing and the tests run as root (as in CI)."""
    if not os.path.exists(CHROMIUM) and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], check=False, capture_output=True)
        subprocess.run(
            ["apt-get", "install", "-y", "chromium"],
            check=True,
            capture_output=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs {CHROMIUM} (apt-get install -y chromium, as root)")
    return CHROMIUM


async def test_a_person_signs_in_approves_one_call_rejects_another_and_approves_a_selection_in_a_browser(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, inbox: Inbox, chromium: str
) -> None:
    # Sign in with the token form, approve one call, reject another with a reason, approve the
    # last one ticked with "Approve selected": the runs finish, each approved tool ran once,
    # the rejected one never, and the model read the reason.
    from playwright.async_api import async_playwright

    invocations: list[str] = []
    agents = desks(model_server, invocations)
    async with serving(client, list(agents)) as worker, httpx.AsyncClient(timeout=30) as http:
        billing, ops, front = await start_desks(client, worker.task_queue, agents)
        ids = {billing.id, ops.id, front.id}

        async def three() -> bool:
            return len(await pending_of(http, inbox, ids)) == 3

        await eventually(three, "three waiting calls")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = await (await browser.new_context()).new_page()
                first = await page.goto(inbox.url + "/")
                assert first is not None and first.status == 401
                await page.fill("input[name=token]", inbox.token)
                await page.click("button[type=submit]")
                await page.wait_for_selector(f'tr[data-run="{billing.id}"]')
                cookies = {c["name"]: c for c in await page.context.cookies()}
                assert cookies["relaykit_inbox"]["httpOnly"] is True
                assert cookies["relaykit_inbox"]["sameSite"] == "Strict"
                row = page.locator(f'tr[data-run="{billing.id}"]')
                assert "refund" in await row.inner_text() and "A-1" in await row.inner_text()
                assert await row.locator("a").get_attribute("href") == (
                    f"{DEFAULT_UI_URL}/namespaces/default/workflows/{billing.id}"
                )
                await row.get_by_role("button", name="Approve").click()
                await page.wait_for_selector("text=approved refund")
                row = page.locator(f'tr[data-run="{ops.id}"]')
                await row.locator("input[name=reason]").fill("the db is mid-migration")
                await row.get_by_role("button", name="Reject").click()
                await page.wait_for_selector("text=rejected restart_service")
                assert await page.locator(f'tr[data-run="{billing.id}"]').count() == 0
                assert await page.locator(f'tr[data-run="{ops.id}"]').count() == 0
                assert await page.locator(f'tr[data-run="{front.id}"]').count() == 1

                # The link `relaykit inbox` printed signs a fresh browser in too.
                other = await (await browser.new_context()).new_page()
                opened = await other.goto(inbox.sign_in_link)
                assert opened is not None and opened.status == 200
                assert other.url == inbox.url + "/"  # the token leaves the address bar
                assert await other.locator(f'tr[data-run="{front.id}"]').count() == 1

                # Tick the last call and approve the selection (the bulk path).
                await other.locator(f'tr[data-run="{front.id}"] input[name=pick]').check()
                await other.get_by_role("button", name="Approve selected").click()
                await other.wait_for_selector("text=approved 1 of 1 selected call")
                assert await other.locator(f'tr[data-run="{front.id}"]').count() == 0
            finally:
                await browser.close()
        results = [await billing.result(), await ops.result(), await front.result()]
    assert sorted(invocations) == ["refund A-1", "wire 70"]
    assert results[0].output.startswith("billing: refunded 30")
    assert "the db is mid-migration" in results[1].output
    assert results[2].output.startswith("front: ")


async def test_the_api_lists_a_run_waiting_at_its_dollar_limit_with_its_spend_and_limit(
    client: Client, model_server: ScriptedModelServer, inbox: Inbox
) -> None:
    # GET /api/budgets: the runs a person may raise (relaykit budget RUN --raise ...).
    from relaykit import Budget
    from tests.test_budgets import SMALL, look, priced_model, spend

    model = priced_model(model_server)
    model_server.script(
        model.name,
        [spend(4000, call("look", topic="a")), spend(4000, call("look", topic="b")), text("x")],
    )
    agent = Agent(name="inbox-budget", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker, httpx.AsyncClient(timeout=30) as http:
        handle = await start_run(
            client, agent, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.006)
        )

        async def listed() -> dict[str, Any] | None:
            response = await http.get(f"{inbox.url}/api/budgets", headers=inbox.auth)
            assert response.status_code == 200, response.text
            return next((w for w in response.json() if w["run_id"] == handle.id), None)

        wait = await eventually(listed, "the run at its limit")
        await handle.set_budget(raise_by=0.01, by="ana")
        assert (await handle.result()).output == "x"
    assert (wait["spent"], wait["limit"]) == (0.004, 0.006)
    assert wait["ui_url"].endswith(handle.id)
