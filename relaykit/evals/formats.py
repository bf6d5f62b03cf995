"""An evaluation's report as Markdown (for people), JSON (``EvalReport``) and JUnit XML (for CI:
one test case per recorded run; a failed run is a failure, a skipped one skipped)."""

from __future__ import annotations

from xml.etree import ElementTree

from relaykit.evals.models import EvalReport, RunReport


def _step(run: RunReport) -> str:
    div = run.divergence
    if div is None:
        return "none"
    if div.tool is None:
        return f"turn {div.turn}: answered (recording {div.recorded})"
    return f"turn {div.turn}: {div.tool}({div.arguments}) (recording {div.recorded})"


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}s"


def _cell(text: str, limit: int = 60) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def markdown(report: EvalReport) -> str:
    t = report.totals
    lines = [
        f"# Evaluation {report.eval_id}",
        "",
        f"- runs: {t.runs} ({t.passed} passed, {t.failed} failed, {t.skipped} skipped)",
        f"- pass rate: {t.pass_rate:.1%}, mean score: {t.mean_score:.3f}",
        f"- tokens: {t.candidate_tokens} against {t.recorded_tokens} recorded "
        f"({t.candidate_tokens - t.recorded_tokens:+d})",
        f"- cost: ${t.candidate_cost_usd:.4f} against ${t.recorded_cost_usd:.4f} recorded "
        f"({t.candidate_cost_usd - t.recorded_cost_usd:+.4f})",
        f"- calls not executed during evaluation: {t.blocked}",
        "",
        "| recorded run | verdict | score | first divergence | matched | live | blocked "
        "| tokens | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report.runs:
        verdict = run.verdict if not run.reason else f"{run.verdict}: {run.reason}"
        lines.append(
            f"| {_cell(run.recorded_run)} | {_cell(verdict)} | {run.score:.2f} "
            f"| {_cell(_step(run), 80)} | {run.matched} | {run.live} | {len(run.blocked)} "
            f"| {run.candidate_usage.total_tokens} / {run.recorded_usage.total_tokens} "
            f"| {_seconds(run.candidate_seconds)} / {_seconds(run.recorded_seconds)} |"
        )
    blocked = [(run, call) for run in report.runs for call in run.blocked]
    if blocked:
        lines += ["", "## Calls not executed during evaluation", ""]
        lines += [
            f"- {run.recorded_run}, turn {call.turn}: {call.tool}({call.arguments})"
            for run, call in blocked
        ]
    failed = [run for run in report.runs if run.verdict == "failed"]
    if failed:
        lines += ["", "## Different answers", ""]
        for run in failed:
            lines += [
                f"### {run.recorded_run}",
                "",
                f"- recorded: {_cell(run.recorded_output, 300)}",
                f"- candidate: {_cell(run.candidate_output, 300)}",
                f"- first divergence: {_step(run)}",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def junit_xml(report: EvalReport) -> str:
    t = report.totals
    suite = ElementTree.Element(
        "testsuite",
        name=f"relaykit eval {report.eval_id}",
        tests=str(t.runs),
        failures=str(t.failed),
        skipped=str(t.skipped),
        errors="0",
    )
    for run in report.runs:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=f"relaykit.eval.{run.agent or 'unknown'}",
            name=run.recorded_run,
            time=f"{run.candidate_seconds or 0:.3f}",
        )
        if run.verdict == "failed":
            failure = ElementTree.SubElement(case, "failure", message=run.reason or "failed")
            failure.text = (
                f"first divergence: {_step(run)}\nrecorded: {run.recorded_output}\n"
                f"candidate: {run.candidate_output}"
            )
        elif run.verdict == "skipped":
            ElementTree.SubElement(case, "skipped", message=run.reason)
    suites = ElementTree.Element("testsuites")
    suites.append(suite)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
