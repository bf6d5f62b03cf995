"""The run console (``relaykit console``) in headless Chromium, against the real dev server, a
real worker and the real ``relaykit console`` process, with three people: an approver, an
operator and a viewer (``RELAYKIT_CONSOLE_USERS``)."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from relaykit import Agent, Budget, get_run, start_run, tool
from relaykit.console.people import Person
from relaykit.devserver import DEFAULT_UI_URL, DevServer
from relaykit.inbox.app import inbox_app
from relaykit.models.spec import ModelSpec, Price
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, call, text
from tests.support import eventually, scripted_model, serving
from tests.test_inbox import CHROMIUM_ARGS, REPO_ROOT, _env, _lines, chromium

__all__ = ["chromium"]  # the fixture, shared with the inbox's tests

PEOPLE = {"alice": "approver", "olga": "operator", "vic": "viewer"}
TOKENS = {name: f"token-of-{name}-0123456789" for name in PEOPLE}
PRICE = Price(input=1.0, output=2.0)


@dataclass
class Console:
    url: str
    proc: subprocess.Popen[str]


def start_console(address: str) -> Console:
    users = ",".join(f"{name}={role}:{TOKENS[name]}" for name, role in PEOPLE.items())
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "console", "--port", "0"],
        cwd=REPO_ROOT,
        env=_env(address, RELAYKIT_CONSOLE_USERS=users),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = _lines(proc.stderr)
    try:
        first = lines.get(timeout=30)
    except queue.Empty:
        proc.kill()
        raise AssertionError("relaykit console did not start") from None
    assert first.startswith("console on "), first
    return Console(url=first.split()[2], proc=proc)


@pytest.fixture(scope="module")
def console(temporal_server: DevServer) -> Iterator[Console]:
    started = start_console(temporal_server.address)
    try:
        yield started
    finally:
        started.proc.terminate()
        started.proc.wait(timeout=15)


@asynccontextmanager
async def browser_for(chromium: str) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def signed_in(browser: Any, console: Console, name: str) -> Any:
    page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
    first = await page.goto(console.url + "/")
    assert first is not None and first.status == 401
    await page.fill("input[name=token]", TOKENS[name])
    await page.click("button[type=submit]")
    await page.wait_for_selector(f"text={name} (")
    return page


async def confirm(page: Any) -> None:
    """Every action asks first: the confirmation page names it; say yes."""
    await page.wait_for_selector("#confirm")
    await page.click("#confirm")


def desks(server: ScriptedModelServer, invocations: list[str]) -> tuple[Agent, Agent]:
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

    def answering(first: Any, done: str) -> Any:
        return lambda req: text(f"{done}: {req.tool_results[-1]}") if req.tool_results else first

    billing_model, ops_model = scripted_model(server), scripted_model(server)
    server.respond(billing_model.name, answering(call("refund", order_id="A-1", amount=30), "b"))
    server.respond(ops_model.name, answering(call("restart_service", name="db"), "ops"))
    return (
        Agent(name="console_billing", model=billing_model, tools=[refund]),
        Agent(name="console_ops", model=ops_model, tools=[restart_service]),
    )


async def test_approvers_decide_from_the_runs_list_and_a_viewer_sees_no_button_and_gets_403(
    client: Client, model_server: ScriptedModelServer, console: Console, chromium: str
) -> None:
    # alice approves one call and rejects another with a reason from the runs list: the runs
    # finish, the approved tool ran once, the model read the reason, the decisions carry her
    # name. vic (viewer) sees the calls without buttons, and his posts are refused with 403.
    invocations: list[str] = []
    billing, ops = desks(model_server, invocations)
    async with serving(client, [billing, ops]) as worker, browser_for(chromium) as browser:
        paid = await start_run(client, billing, "refund A-1", task_queue=worker.task_queue)
        fixed = await start_run(client, ops, "restart the db", task_queue=worker.task_queue)
        page = await signed_in(browser, console, "alice")
        cookies = {c["name"]: c for c in await page.context.cookies()}
        assert cookies["relaykit_console"]["httpOnly"] and TOKENS["alice"] not in str(cookies)

        async def both_listed() -> bool:
            await page.goto(console.url + "/approvals")
            rows = page.locator(f'tr[data-run="{paid.id}"], tr[data-run="{fixed.id}"]')
            return await rows.locator("form[data-action=approve]").count() == 2

        await eventually(both_listed, "both calls with their buttons on the runs list", 30)
        counts = await page.locator('.counts a[data-reason="approval"]').inner_text()
        assert int(counts.rsplit(" ", 1)[1]) >= 2
        await page.goto(f"{console.url}/")
        await shoot(page, "console-runs.png")
        for query, shown in (
            (f"text={paid.id[:-4]}", {paid.id}),
            ("agent=console_ops&reason=approval", {fixed.id}),
        ):
            await page.goto(f"{console.url}/?{query}")
            rows = await page.locator("tr[data-run]").evaluate_all(
                "rows => rows.map(r => r.dataset.run)"
            )
            assert set(rows) == shown, query
        await page.goto(f"{console.url}/approvals")
        row = page.locator(f'tr[data-run="{paid.id}"]')
        assert "refund" in await row.inner_text() and "A-1" in await row.inner_text()
        assert "approval" in await row.inner_text()  # what it waits for
        await row.get_by_role("button", name="Approve").click()
        await confirm(page)
        await page.wait_for_selector("text=approved refund")
        row = page.locator(f'tr[data-run="{fixed.id}"]')
        await row.locator("input[name=reason]").fill("the db is mid-migration")
        await row.get_by_role("button", name="Reject").click()
        await page.wait_for_selector("text=the db is mid-migration")  # the confirmation says it
        await confirm(page)
        await page.wait_for_selector("text=rejected restart_service")
        results = [await paid.result(), await fixed.result()]
        answered = [e for e in await paid.events() if e.kind == "approval_answered"]

        viewer = await signed_in(browser, console, "vic")
        await viewer.goto(f"{console.url}/runs/{paid.id}")
        await viewer.wait_for_selector("text=refund")
        assert await viewer.locator("button", has_text="Approve").count() == 0
        assert await viewer.locator("form.act").count() == 0
        refused = await viewer.request.post(
            f"{console.url}/runs/{fixed.id}/act",
            form={"action": "cancel", "confirmed": "1", "csrf": "x"},
        )
        assert refused.status == 403
        session = {"relaykit_console": cookies["relaykit_console"]["value"]}
        async with (
            httpx.AsyncClient(timeout=30) as http,
            httpx.AsyncClient(timeout=30, cookies=session) as alice,
        ):
            as_viewer = await http.post(
                f"{console.url}/api/runs/{fixed.id}/cancel",
                json={},
                headers={"authorization": f"Bearer {TOKENS['vic']}"},
            )
            assert as_viewer.status_code == 403 and "viewer" in as_viewer.json()["error"]
            nobody = await http.get(f"{console.url}/api/runs")
            assert nobody.status_code == 401
            forged = await alice.post(
                f"{console.url}/runs/{fixed.id}/act", data={"action": "cancel", "confirmed": "1"}
            )
            assert forged.status_code == 403  # a cookie without the form's CSRF token
    assert invocations == ["refund A-1"]
    assert results[0].output.startswith("b: refunded 30")
    assert isinstance(ops.model, ModelSpec)
    [read] = [r for r in model_server.requests(ops.model.name) if r.tool_results]
    assert "the db is mid-migration" in read.tool_results[-1]
    assert answered and answered[0].data["approved"] is True
    assert answered[0].data["by"] == "alice"


SHOTS_ENV = "RELAYKIT_CONSOLE_SCREENSHOTS"
"""A directory: the run-page test saves the runs list and a run's page there (docs/console.md)."""


async def shoot(page: Any, name: str) -> None:
    where = os.environ.get(SHOTS_ENV)
    if where:
        await page.screenshot(path=os.path.join(where, name), full_page=False)


def lead_team(server: ScriptedModelServer, held: threading.Event) -> tuple[Agent, Agent]:
    """A lead that looks something up and asks a researcher (a child run), and a slow agent
    whose first model call is held until ``held`` is set."""

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"{q}: 13 species"

    researcher_model = scripted_model(server, price=PRICE)
    server.respond(researcher_model.name, lambda req: text("otters are mustelids"))
    researcher = Agent(name="console_researcher", model=researcher_model)

    def lead_step(req: ScriptedRequest) -> Any:
        done = len(req.tool_results)
        if done == 0:
            return call("lookup", q="otters")
        if done == 1:
            return call("ask_console_researcher", input="what are otters?")
        return text(f"lead: {req.tool_results[-1]}")

    lead_model = scripted_model(server, price=PRICE)
    server.respond(lead_model.name, lead_step)
    lead = Agent(name="console_lead", model=lead_model, tools=[lookup, researcher.as_tool()])

    slow_model = scripted_model(server, price=PRICE)

    def slow_step(req: ScriptedRequest) -> Any:
        if req.last_user_text == "actually: seals":
            return text("seals are pinnipeds")
        return text("otters (the question before the steer)", hold=held)

    server.respond(slow_model.name, slow_step)
    return lead, Agent(name="console_slow", model=slow_model)


async def test_a_runs_page_shows_conversation_children_and_costs_and_operators_steer_fork_and_raise_budgets(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, console: Console, chromium: str
) -> None:
    # olga (operator) reads a finished run's conversation, children and cost by agent, forks it
    # at turn 1 with new input, steers a run whose model call is held (its live events show the
    # steer), and raises the budget of a run waiting at its limit; each run records her name.
    held = threading.Event()
    lead, slow = lead_team(model_server, held)
    try:
        async with serving(client, [lead, slow]) as worker, browser_for(chromium) as browser:
            queue_ = worker.task_queue
            done = await start_run(client, lead, "tell me about otters", task_queue=queue_)
            await done.result()
            page = await signed_in(browser, console, "olga")
            await page.goto(f"{console.url}/runs/{done.id}")
            conversation = await page.locator("ul.conv").first.inner_text()
            for said in ("tell me about otters", "lookup", '"q": "otters"', "otters: 13 species"):
                assert said in conversation, said
            assert "lead: otters are mustelids" in conversation
            child = page.locator("[data-child]")
            assert await child.count() == 1
            assert "console_researcher" in await child.inner_text()
            assert "completed" in await child.inner_text()
            costs = await page.locator("h2:has-text('Cost by agent') + table").inner_text()
            assert "console_lead" in costs and "console_researcher" in costs
            assert await page.locator("#temporal-ui").get_attribute("href") == (
                f"{DEFAULT_UI_URL}/namespaces/default/workflows/{done.id}"
            )
            await shoot(page, "console-run.png")
            await child.locator("a").click()  # a child's page: its own conversation
            await page.wait_for_selector("li[data-kind=final]")
            assert "what are otters?" in await page.locator("ul.conv").first.inner_text()
            assert done.id in await page.locator("a", has_text=done.id).first.inner_text()
            await page.goto(f"{console.url}/runs/{done.id}")

            fork = page.locator("form[data-action=fork]")
            await fork.locator("input[name=turn]").fill("1")
            await fork.locator("input[name=text]").fill("and what about their diet?")
            await fork.get_by_role("button", name="Fork at turn").click()
            await confirm(page)
            await page.wait_for_selector(f"text=forked {done.id} at turn 1 as")
            forked_id = page.url.split("/runs/", 1)[1].split("?", 1)[0]
            assert forked_id != done.id
            forked = await get_run(client, forked_id).result()
            assert forked.forked_from == f"{done.id}@1"

            slow_run = await start_run(client, slow, "tell me about otters", task_queue=queue_)
            capped = await start_run(
                client,
                lead,
                "otters again",
                task_queue=queue_,
                budget=Budget(max_usd=0.000001),
            )
            assert isinstance(slow.model, ModelSpec)
            await asyncio.to_thread(model_server.wait_for_requests, slow.model.name, 1)
            watcher = await page.context.new_page()  # a second tab, open before the steer
            await watcher.goto(f"{console.url}/runs/{slow_run.id}")
            await page.goto(f"{console.url}/runs/{slow_run.id}")
            steer = page.locator("form[data-action=steer]")
            await steer.locator("input[name=text]").fill("actually: seals")
            await steer.get_by_role("button", name="Steer").click()
            await confirm(page)
            await page.wait_for_selector("text=steered: the model call in flight was cancelled")
            await watcher.wait_for_selector("#live li:has-text('steered')", timeout=20_000)
            assert (await slow_run.result()).output == "seals are pinnipeds"

            async def at_its_limit() -> bool:
                await page.goto(f"{console.url}/?reason=budget")
                return await page.locator(f'tr[data-run="{capped.id}"]').count() == 1

            await eventually(at_its_limit, "the capped run listed as waiting for budget", 30)
            row = await page.locator(f'tr[data-run="{capped.id}"]').inner_text()
            assert "spent $" in row and "of $0.000001" in row
            inbox = httpx.ASGITransport(app=inbox_app(client))  # the inbox's JSON API says it too
            async with httpx.AsyncClient(transport=inbox, base_url="http://127.0.0.1") as http:
                waits = (await http.get("/api/budgets")).json()
            assert {"run_id": capped.id, "limit": 0.000001} in [
                {"run_id": w["run_id"], "limit": w["limit"]} for w in waits
            ]
            await page.goto(f"{console.url}/runs/{capped.id}")
            budget = page.locator("form[data-action=budget]")
            await budget.locator("input[name=amount]").fill("1")
            await budget.get_by_role("button", name="Raise budget").click()
            await confirm(page)
            await page.wait_for_selector("text=budget raised by")
            assert (await capped.result()).output.startswith("lead: ")
            logged = {
                kind: [e.data.get("by") for e in await handle.events() if e.kind == kind]
                for handle, kind in ((slow_run, "steered"), (capped, "budget_changed"))
            }
            started = [
                e for e in await get_run(client, forked_id).events() if e.kind == "run_started"
            ]
    finally:
        held.set()
    assert logged == {"steered": ["olga"], "budget_changed": ["olga"]}
    assert started[0].data.get("by") == "olga"


async def test_the_console_says_temporal_is_unreachable_and_comes_back_by_itself(
    chromium: str,
) -> None:
    # Temporal stops while a person has the runs list open: the page, reloading itself, says
    # so (503, no blank 500) and retries by itself; Temporal back on the same address, the same
    # tab shows the runs again without anyone reloading it or restarting the console.
    server = DevServer(port=0, headless=True, in_memory=True).start()
    console = start_console(server.address)
    try:
        async with browser_for(chromium) as browser:
            page = await signed_in(browser, console, "vic")
            await page.wait_for_selector("h1:has-text('Runs')")
            server.stop()
            statuses: list[int] = []
            page.on("response", lambda response: statuses.append(response.status))
            # The open page reloads itself and finds Temporal gone.
            await page.wait_for_selector("text=Temporal is unreachable", timeout=60_000)
            assert 503 in statuses and 500 not in statuses
            text_ = await page.inner_text("body")
            assert f"Temporal is unreachable at {server.address}" in text_
            assert "retries by itself" in text_
            async with httpx.AsyncClient(timeout=60) as http:
                api = await http.get(
                    f"{console.url}/api/runs", headers={"authorization": f"Bearer {TOKENS['vic']}"}
                )
            assert api.status_code == 503 and api.json()["retry_after"] == 5
            port = int(server.address.rsplit(":", 1)[1])
            back = DevServer(port=port, headless=True, in_memory=True).start()
            try:
                await page.wait_for_selector("h1:has-text('Runs')", timeout=60_000)
            finally:
                back.stop()
    finally:
        console.proc.terminate()
        console.proc.wait(timeout=15)
        server.stop()


def test_people_sign_in_with_their_own_token_and_a_forged_session_is_nobody(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tokens from a file (plain or as sha256) and the environment; the session names the person
    # without holding the token; a session edited to name someone else is refused.
    import hashlib

    from relaykit.console.people import People
    from relaykit.errors import RelaykitError

    users = tmp_path / "people.toml"
    digest = hashlib.sha256(b"bob-secret").hexdigest()
    users.write_text(
        '[users.ann]\nrole = "approver"\ntoken = "ann-secret"\n'
        f'[users.bob]\nrole = "viewer"\ntoken_sha256 = "{digest}"\n'
    )
    monkeypatch.setenv("RELAYKIT_CONSOLE_USERS", "cy=operator:cy-secret")
    people = People.configure(
        users_file=str(users), trust_header=None, default_role=None, local_user="me"
    )
    assert people.needs_sign_in and people.guarded
    sessions = {name: people.sign_in(f"{name}-secret") for name in ("ann", "bob", "cy")}
    assert people.sign_in("wrong") is None
    for name, role in (("ann", "approver"), ("bob", "viewer"), ("cy", "operator")):
        session = sessions[name]
        assert session is not None and f"{name}-secret" not in session
        assert people.person({}, {"relaykit_console": session}) == Person(name, role)
    forged = b"ann".hex() + sessions["bob"].split(".", 1)[1]  # type: ignore[union-attr]
    assert people.person({}, {"relaykit_console": forged}) is None
    assert people.by_bearer({"authorization": "Bearer cy-secret"}) == Person("cy", "operator")
    users.write_text('[users.dan]\nrole = "admin"\ntoken = "x"\n')
    with pytest.raises(RelaykitError, match="not one of viewer, operator, approver"):
        People.configure(users_file=str(users), trust_header=None, default_role=None, local_user="")


async def test_a_trusted_header_names_the_person_and_the_mapping_gives_the_role(
    client: Client,
) -> None:
    # Behind a proxy: the header's name, the role from the users mapping or the default role;
    # without the header, or a name without a role, nobody is signed in.
    from relaykit.console.app import console_app
    from relaykit.console.people import People, parse_users_env

    async def ask(people: People, method: str, path: str, name: str | None) -> httpx.Response:
        transport = httpx.ASGITransport(app=console_app(client, people))
        headers = {"x-forwarded-user": name} if name else {}
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as http:
            return await http.request(method, path, headers=headers, json={})

    mapped = parse_users_env("ann=approver:unused")
    proxied = People(mapped, trust_header="X-Forwarded-User", default_role="viewer")
    assert (await ask(proxied, "GET", "/api/runs", "ann")).status_code == 200
    refused = await ask(proxied, "POST", "/api/runs/some-run/cancel", "zed")
    assert refused.status_code == 403 and "zed is a viewer" in refused.json()["error"]
    page = await ask(proxied, "GET", "/runs/some-run", "zed")
    assert page.status_code == 404 and "Cancel run" not in page.text
    assert (await ask(proxied, "GET", "/api/runs", None)).status_code == 401
    strict = People(mapped, trust_header="X-Forwarded-User")
    assert (await ask(strict, "GET", "/api/runs", "zed")).status_code == 401


def test_the_console_refuses_to_listen_off_loopback_without_sign_in(
    temporal_server: DevServer,
) -> None:
    # Anyone who reaches a console nobody signs in to could act on runs: one line, status 1.
    done = subprocess.run(
        [sys.executable, "-m", "relaykit.cli", "console", "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO_ROOT,
        env=_env(temporal_server.address),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: refusing to serve the console on 0.0.0.0 without sign-in")
    assert "Traceback" not in done.stderr
