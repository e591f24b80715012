"""The Claude trainer agent end to end, offline: the REAL `anthropic` client talks to a local HTTP
server (tests/anthropic_fake.py) that answers POST /v1/messages with recorded Messages API exchanges
(tests/fixtures/anthropic/*.json) and records every request, so the tests check both what the
agent did to a real smoke campaign and what it sent (tool results, errors, cache breakpoints, model).

One smoke campaign with agent = "claude" trains v000 once (module fixture); each scenario copies it
and resumes it through the CLI with its own recorded exchanges. EVOTRAINER_DEBUG_DIE_AFTER stops a
scenario right after the phase it is about, so only the fallback scenario trains a v001.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from anthropic_fake import FakeAnthropic, load

from evotrainer import schema
from evotrainer.agent.base import AgentContext
from evotrainer.agent.tools import MAX_SAMPLE_ROWS, TOOL_NAMES, ToolBox
from evotrainer.loopstate import derive
from evotrainer.status import from_ledger, from_tables
from evotrainer.store import Store

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-ant-fixture-key-never-stored"
MODEL = "claude-fixture-1"
CLAUDE_TOML = f"""
[claude]
model = "{MODEL}"
max_retries = 2
backoff_base_s = 0.001
backoff_max_s = 0.01
budget_usd = 0.5
"""


def cli(*args, data_dir, env_extra=None, timeout=600):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(EVOTRAINER_DATA=str(data_dir), PYTHONPATH=str(ROOT), NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def events(store, kind):
    return [e for e in store.ledger.events() if e.kind == kind]


def usage_of(exchanges):
    keys = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return {k: sum(ex["body"]["usage"][k] for ex in exchanges if ex.get("status", 200) == 200) for k in keys}


def tool_results(body):
    """The tool_result blocks of the request's last user message, by tool_use_id."""
    last = body["messages"][-1]
    assert last["role"] == "user"
    return {b["tool_use_id"]: b for b in last["content"] if b.get("type") == "tool_result"}


def text_of(block) -> str:
    c = block["content"]
    return c if isinstance(c, str) else "".join(x.get("text", "") for x in c)


@pytest.fixture(scope="module")
def fake():
    f = FakeAnthropic().start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def base(tmp_path_factory, data_dir):
    """A smoke campaign (agent claude, the [claude] config above) with v000 trained and judged."""
    d = tmp_path_factory.mktemp("claude")
    cfg = d / "claude.toml"
    cfg.write_text(CLAUDE_TOML)
    res = cli("run", str(cfg), "--preset", "smoke", "--campaign", str(d / "base"), "--versions", "1",
              "--agent", "claude", data_dir=data_dir,
              env_extra={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store.open(d / "base")
    assert store.campaign.agent == "claude" and store.campaign.claude.model == MODEL
    assert not events(store, "agent_usage")  # v000 needs no agent
    return d / "base"


def scenario(base, tmp_path, fake, data_dir, *fixtures, die_after=None, versions=2):
    camp = tmp_path / "camp"
    shutil.copytree(base, camp)
    fake.reset()
    fake.load(*fixtures)
    env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": fake.url}
    if die_after:
        env["EVOTRAINER_DEBUG_DIE_AFTER"] = die_after
    res = cli("run", "--campaign", str(camp), "--resume", "--versions", str(versions), data_dir=data_dir,
              env_extra=env)
    if die_after:
        assert res.returncode == -9, res.stdout[-3000:] + res.stderr[-3000:]
    else:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return Store.open(camp), res


def check_request_shape(body):
    assert body["model"] == MODEL
    assert [t["name"] for t in body["tools"]] == list(TOOL_NAMES)
    system = body["system"]
    assert system[-1]["cache_control"] == {"type": "ephemeral"}  # tools + system prompt + campaign summary
    assert all("cache_control" not in b for b in system[:-1])
    blocks = [b for m in body["messages"] for b in m["content"]]
    assert blocks[-1].get("cache_control") == {"type": "ephemeral"}  # the conversation so far
    assert sum("cache_control" in b for b in blocks) == 1  # at most 4 breakpoints in all


# --------------------------------------------------------------------------- scenarios through the CLI


@pytest.mark.slow  # a real campaign: runs in CI (scripts/test.sh), not in the fast default set
def test_reads_the_store_proposes_and_ranks_and_the_controller_selects_its_choice(base, tmp_path, fake, data_dir):
    store, res = scenario(base, tmp_path, fake, data_dir, "propose_happy", die_after="intervention_selected")
    assert fake.unexpected == 0 and len(fake.requests) == 5
    bodies = fake.bodies
    for r in fake.requests:
        assert r["path"] == "/v1/messages"
    for b in bodies:
        check_request_shape(b)
    assert "v000" in bodies[0]["messages"][0]["content"][0]["text"]  # the round's brief names the parent
    # Round 2 carries the store reads back: the health report and the capped rollout sample.
    results = tool_results(bodies[1])
    health, sample = results["toolu_01HappyHealth000000001"], results["toolu_01HappySample000000001"]
    assert not health.get("is_error") and not sample.get("is_error")
    assert '"counts"' in text_of(health) and "f-" in text_of(health)
    rows = [json.loads(line) for line in text_of(sample).splitlines() if line.startswith("{")]
    assert len(rows) == 3 and all(len(r["prompt"]) < 60 + 20 for r in rows)
    assert "...[+" in text_of(sample)
    q = text_of(tool_results(bodies[2])["toolu_01HappyQuery0000000001"])
    assert [json.loads(line)["step"] for line in q.splitlines()] == [1, 2, 3]
    accepted = tool_results(bodies[3])
    assert all("accepted iv-" in text_of(b) and not b.get("is_error") for b in accepted.values())
    # The proposals are stored, authored by claude, in the model's order.
    proposed = [e for e in events(store, "intervention_proposed") if e.version == "v001"]
    assert [e.actor for e in proposed] == ["claude", "claude"]
    ivs = [store.read_intervention(e.intervention_id) for e in proposed]
    assert [iv.author for iv in ivs] == ["claude", "claude"]
    assert ivs[0].change.factor == "hparam" and ivs[0].change.value == 1.3
    assert ivs[1].change.factor == "filter" and ivs[1].change.group_filter.kind == "zero_std"
    # The ranking call is forced to rank_candidates and lists both candidates; the model put the second first.
    rank = bodies[4]
    assert rank["tool_choice"] == {"type": "tool", "name": "rank_candidates"}
    assert all(iv.intervention_id in rank["messages"][0]["content"][0]["text"] for iv in ivs)
    selected = events(store, "intervention_selected")
    assert [e.intervention_id for e in selected] == [ivs[1].intervention_id]
    # (the storm scenario below trains a v001 to the end; this one stops once the choice is recorded)
    # Usage: one event per phase with the recorded token counts and the priced cost.
    usage = events(store, "agent_usage")
    assert [(u.phase, u.outcome, u.calls, u.model) for u in usage] == [
        ("propose", "answered", 4, MODEL), ("rank", "answered", 1, MODEL)]
    recorded = usage_of(load("propose_happy"))
    assert sum(u.input_tokens for u in usage) == recorded["input_tokens"]
    assert sum(u.output_tokens for u in usage) == recorded["output_tokens"]
    assert sum(u.cache_creation_tokens for u in usage) == recorded["cache_creation_input_tokens"]
    assert sum(u.cache_read_tokens for u in usage) == recorded["cache_read_input_tokens"]
    prices = schema.ModelPrices()
    cost = prices.cost(*recorded.values())
    assert abs(sum(u.cost_usd for u in usage) - cost) < 1e-6
    assert "claude propose (answered)" in res.stdout
    # The ledger replays as before (the new event kind is ignored where it does not matter).
    assert from_ledger(store).comparable() == from_tables(store).comparable()
    # The key is read from the environment only: no file of the campaign holds it.
    assert not [p for p in store.root.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    # `evotrainer report`: token and cost figures per version and in total.
    rep = cli("report", str(store.root), data_dir=data_dir)
    assert rep.returncode == 0, rep.stderr
    md = (store.root / "report.md").read_text()
    section = md.split("## Agent usage", 1)[1]
    total_line = next(line for line in section.splitlines() if line.startswith("| total"))
    v001_line = next(line for line in section.splitlines() if line.startswith("| v001"))
    for line in (total_line, v001_line):
        assert f"{recorded['input_tokens']:,}" in line and f"{recorded['output_tokens']:,}" in line
        assert f"{recorded['cache_creation_input_tokens']:,}" in line
        assert f"{recorded['cache_read_input_tokens']:,}" in line and f"{cost:.4f}" in line
    assert "| 5 |" in total_line and "propose answered; rank answered" in v001_line
    assert "Budget $0.50" in section


@pytest.mark.slow  # a real campaign: runs in CI (scripts/test.sh), not in the fast default set
def test_malformed_tool_calls_come_back_as_errors_and_nothing_is_stored(base, tmp_path, fake, data_dir):
    store, res = scenario(base, tmp_path, fake, data_dir, "propose_malformed", die_after="intervention_proposed")
    assert fake.unexpected == 0 and len(fake.requests) == 3
    errors = tool_results(fake.bodies[1])
    assert set(errors) == {"toolu_01BadUnknown000000001", "toolu_01BadBothFilters0000001", "toolu_01BadJson00000000000001"}
    assert all(b.get("is_error") is True for b in errors.values())
    assert "unknown tool 'delete_campaign'" in text_of(errors["toolu_01BadUnknown000000001"])
    assert "exactly one of group_filter / trajectory_filter" in text_of(errors["toolu_01BadBothFilters0000001"])
    assert "change is not valid JSON" in text_of(errors["toolu_01BadJson00000000000001"])
    fixed = tool_results(fake.bodies[2])["toolu_01BadFixed0000000000001"]
    assert not fixed.get("is_error") and "accepted" in text_of(fixed)
    # Only the corrected proposal exists, in the ledger and on disk.
    proposed = events(store, "intervention_proposed")
    assert len(proposed) == 1
    assert [iv.intervention_id for iv in store.interventions()] == [proposed[0].intervention_id]
    iv = store.interventions()[0]
    assert iv.change.group_filter.kind == "std_ema" and iv.change.group_filter.keep_ratio == 0.8
    assert iv.change.trajectory_filter is None and iv.author == "claude"
    assert "refused" in res.stdout


@pytest.mark.slow  # a real campaign: runs in CI (scripts/test.sh), not in the fast default set
def test_rate_limit_is_retried_after_retry_after(base, tmp_path, fake, data_dir):
    store, res = scenario(base, tmp_path, fake, data_dir, "rate_limited", die_after="intervention_proposed")
    assert fake.unexpected == 0 and len(fake.requests) == 3
    assert fake.bodies[0] == fake.bodies[1]  # the same request again
    assert "HTTP 429" in res.stdout and "retry 1 of 2 in 0.0 s" in res.stdout
    (iv,) = store.interventions()
    assert iv.author == "claude" and iv.change.name == "learning_rate"
    (u,) = events(store, "agent_usage")
    assert (u.outcome, u.calls) == ("answered", 2)  # the 429 cost nothing


@pytest.mark.slow  # a real campaign: runs in CI (scripts/test.sh), not in the fast default set
def test_server_error_storm_falls_back_to_the_playbook_and_the_campaign_goes_on(base, tmp_path, fake, data_dir):
    store, res = scenario(base, tmp_path, fake, data_dir, "server_errors")
    proposed = [e for e in events(store, "intervention_proposed") if e.version == "v001"]
    ivs = [store.read_intervention(e.intervention_id) for e in proposed]
    assert ivs and all(iv.author == "playbook" for iv in ivs)
    assert all(iv.rationale.startswith("fallback for claude (API failure: the Messages API failed after 3 attempt(s)")
               for iv in ivs)
    # 1 + max_retries attempts for the proposal, the same for the ranking when there is something to rank.
    assert len(fake.requests) == (6 if len(ivs) > 1 else 3) and fake.unexpected == 0
    usage = events(store, "agent_usage")
    assert usage[0].phase == "propose" and usage[0].outcome == "fallback" and usage[0].calls == 0
    assert "HTTP 500" in usage[0].reason and usage[0].cost_usd == 0
    if len(ivs) > 1:
        assert (usage[1].phase, usage[1].outcome) == ("rank", "fallback")
    assert "the playbook proposes instead" in res.stdout
    assert store.versions() == ["v000", "v001"]
    assert [e.version for e in events(store, "version_judged")] == ["v000", "v001"]


@pytest.mark.slow  # a real campaign: runs in CI (scripts/test.sh), not in the fast default set
def test_budget_cap_stops_the_calls_and_the_playbook_answers(base, tmp_path, fake, data_dir):
    store, _ = scenario(base, tmp_path, fake, data_dir, "budget", die_after="intervention_selected")
    assert len(fake.requests) == 1 and fake.unexpected == 0  # nothing after the budget was reached
    usage = events(store, "agent_usage")
    assert usage[0].phase == "propose" and usage[0].outcome == "fallback" and usage[0].calls == 1
    assert usage[0].cost_usd >= 0.5 and "budget reached" in usage[0].reason
    ivs = [store.read_intervention(e.intervention_id) for e in events(store, "intervention_proposed")]
    assert ivs and all(iv.author == "playbook" and "budget reached" in iv.rationale for iv in ivs)
    if len(ivs) > 1:
        assert (usage[1].phase, usage[1].outcome, usage[1].calls) == ("rank", "fallback", 0)
        assert "budget reached" in usage[1].reason
    assert len(events(store, "intervention_selected")) == 1


@pytest.mark.slow  # a real campaign: runs in CI (scripts/test.sh), not in the fast default set
def test_wait_mode_stops_with_the_state_intact_and_resume_continues(base, tmp_path, fake, data_dir, monkeypatch):
    from evotrainer.agent.claude import ClaudeAgent, ClaudeUnavailable
    from evotrainer.controller import run_campaign

    camp = tmp_path / "camp"
    shutil.copytree(base, camp)
    fake.reset()
    fake.load("server_errors")
    monkeypatch.setenv("EVOTRAINER_DATA", str(data_dir))
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    store = Store.open(camp)
    before = store.ledger.events()
    spec = store.campaign.claude.model_copy(update={"on_api_failure": "wait"})
    lines: list[str] = []
    with pytest.raises(ClaudeUnavailable, match="--resume"):
        run_campaign(camp, None, 2, resume=True, log=lines.append, agent=ClaudeAgent(spec, log=lines.append))
    assert len(fake.requests) == 3
    after = store.ledger.events()
    new = after[len(before):]
    assert [e.kind for e in new] == ["agent_usage"] and new[0].outcome == "stopped"
    assert not store.interventions() and not derive(after, store.campaign.name).loop("v001").proposed
    assert store.controller_pid() is None  # the lock was released
    # --resume with the API back: the proposal phase is redone once.
    fake.reset()
    fake.load("rate_limited")
    res = cli("run", "--campaign", str(camp), "--resume", "--versions", "2", data_dir=data_dir,
              env_extra={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": fake.url,
                         "EVOTRAINER_DEBUG_DIE_AFTER": "intervention_proposed"})
    assert res.returncode == -9, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store.open(camp)
    assert len(events(store, "intervention_proposed")) == 1
    assert [u.outcome for u in events(store, "agent_usage")] == ["stopped", "answered"]


# --------------------------------------------------------------------------- in-process: tools, retries, config


@pytest.fixture
def ctx(base, tmp_path):
    camp = tmp_path / "camp"
    shutil.copytree(base, camp)
    store = Store.open(camp)
    state = derive(store.ledger.events(), store.campaign.name)
    return AgentContext.build(store, state, "v001", "v000")


PROPOSAL = {
    "change": {"factor": "hparam", "name": "temperature", "value": 1.2},
    "hypothesis": {"if": "we sample hotter", "then": "reward spread rises", "because": "samples differ more"},
    "target_metric": "reward_spread",
    "success_criterion": {"metric": "reward_spread", "op": ">", "threshold": 0.0},
    "rollback_plan": "restore temperature 1.0",
}


def test_tools_bound_their_outputs_and_refuse_bad_queries(ctx):
    box = ToolBox(ctx)
    text, err = box.call("list_versions", {})
    assert not err and json.loads(text)["version"] == "v000" and json.loads(text)["outcome"] == "promote"
    text, err = box.call("query_evidence", {"group_by": ["rollout_uid"], "limit": 5})
    assert not err and len(text.splitlines()) == 6 and "result rows, 5 shown" in text
    text, err = box.call("query_evidence", {"group_by": ["no_such_column"]})
    assert err and "no column no_such_column" in text and "rollout_uid" in text
    text, err = box.call("query_evidence", {"versions": ["v000"]})
    assert err and "group_by and/or aggregates" in text
    text, err = box.call("query_evidence", {"where": [{"column": "reward", "op": "~", "value": 1}],
                                            "aggregates": [{"column": "reward", "fn": "mean"}]})
    assert err and "op '~'" in text
    text, err = box.call("query_evidence", {"table": "metrics", "group_by": ["name"], "limit": 3})
    assert not err and text.count("\n") == 3
    text, err = box.call("sample_rollouts", {"n": 500, "max_chars": 20})
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert not err and len(rows) == min(MAX_SAMPLE_ROWS, 24) and all(len(r["completion"]) <= 20 + 16 for r in rows)
    text, err = box.call("sample_rollouts", {"version": "v009"})
    assert err and "no version v009" in text
    group = rows[0]["group_id"]
    text, err = box.call("sample_rollouts", {"group_id": group, "columns": ["reward", "advantage"]})
    assert not err and text.count('"rollout_uid"') == 4
    text, err = box.call("sample_turns", {})
    assert not err and "no turns" in text
    text, err = box.call("health_report", {"version": "v000", "include_metrics": True, "metric_prefix": "dead"})
    assert not err and '"metrics"' in text and all(k.startswith("dead") for k in json.loads(text.splitlines()[-1])["metrics"])
    small = ToolBox(ctx, max_chars=500)
    text, err = small.call("sample_rollouts", {"n": 20, "max_chars": 2000})
    assert not err and len(text) < 600 and "[output cut:" in text
    text, err = box.call("health_report", "not json {")
    assert err and "not valid JSON" in text
    text, err = box.call("list_versions", {"verbose": True})
    assert err and "takes no verbose" in text


def test_propose_validation_and_no_store_writes(ctx):
    box = ToolBox(ctx)
    text, err = box.call("propose_intervention", {**PROPOSAL, "evidence": ["f-000000000000"]})
    assert err and "unknown finding id" in text
    text, err = box.call("propose_intervention", {**PROPOSAL, "change": {"factor": "hparam", "name": "temperature",
                                                                        "value": 9.0}})
    assert err and "out of range" in text
    text, err = box.call("propose_intervention", {**PROPOSAL, "change": {"factor": "hparam", "name": "temperature",
                                                                        "value": 1.0}})
    assert err and "changes nothing" in text
    fid = ctx.health.findings[0].finding_id
    text, err = box.call("propose_intervention", {**PROPOSAL, "evidence": [fid]})
    assert not err and len(box.proposals) == 1 and box.proposals[0].evidence == (fid,)
    text, err = box.call("propose_intervention", PROPOSAL)
    assert err and "already one of your candidates" in text
    assert not ctx.store.interventions()  # the controller stores proposals, not the tool
    ctx.n_candidates = 1
    text, err = box.call("propose_intervention", {**PROPOSAL, "change": {"factor": "hparam", "name": "temperature",
                                                                        "value": 1.4}})
    assert err and "already have 1 valid candidates" in text
    text, err = box.call("rank_candidates", {"intervention_ids": ["x"]})
    assert err and "ranking step" in text


def test_backtest_and_diagnostic_tools(ctx):
    box = ToolBox(ctx)
    text, err = box.call("backtest", {"change": {"factor": "filter", "group_filter": {"kind": "zero_std"}},
                                      "success_criterion": {"metric": "effective_data", "op": ">=", "threshold": 0}})
    out = json.loads(text)
    assert not err and out["verdict"] in ("supports", "contradicts", "inconclusive") and out["stored"] is False
    assert not ctx.store.backtests()
    text, err = box.call("run_diagnostic", {"name": "dead_groups"})
    assert not err and "f-" in text and '"metrics"' in text
    text, err = box.call("run_diagnostic", {"name": "nope"})
    assert err and "dead_groups" in text
    src = ("def diagnose(rollouts, metrics):\n"
           "    share = float((rollouts['completion'].str.len_chars() >= 1).mean())\n"
           "    return {'metrics': {'nonempty': share}, 'findings': [{'severity': 'warning', 'code': 'short',\n"
           "            'message': 'completions are short', 'rollout_uids': rollouts['rollout_uid'].head(2).to_list()}]}\n")
    text, err = box.call("write_diagnostic", {"name": "short_answers", "source": src, "reason": "are answers cut?"})
    assert not err and "saved" in text, text
    (meta, saved_src), = ctx.store.user_diagnostics("short_answers")
    assert meta.author == "claude" and saved_src == src
    fid = json.loads(text.splitlines()[1])["id"]
    text, err = box.call("propose_intervention", {**PROPOSAL, "evidence": [fid]})  # its finding can be cited
    assert not err, text
    text, err = box.call("run_diagnostic", {"name": "short_answers"})
    assert not err and "saved" in text and "by claude" in text
    text, err = box.call("write_diagnostic", {"name": "broken_one", "source": "def diagnose(r, m):\n    return 1/0\n",
                                              "reason": "fails on purpose"})
    assert err and "ZeroDivisionError" in text and not ctx.store.user_diagnostics("broken_one")


def test_memory_and_skills_tools_absent_or_present(ctx, monkeypatch):
    import evotrainer

    for mod in ("memory", "skills"):
        monkeypatch.delattr(evotrainer, mod, raising=False)
        monkeypatch.setitem(sys.modules, f"evotrainer.{mod}", None)
    box = ToolBox(ctx)
    for tool, args in (("read_memory", {}), ("write_memory", {"text": "x"}), ("search_skills", {})):
        text, err = box.call(tool, args)
        assert err and text.startswith("error: not available"), (tool, text)
    assert not box.call("list_versions", {})[1]  # reads still work without the search trace

    calls = []
    memory = types.ModuleType("evotrainer.memory")
    memory.compact = lambda store, max_chars=6000: "ledger: v000 promoted"
    memory.notes = lambda store: [{"author": "claude", "text": "dead groups everywhere"}]
    memory.add_note = lambda store, text, author: calls.append(("note", text, author))
    memory.record_search = lambda store, tool, query, where, author: calls.append(("search", tool, where, author))

    class Skill:
        skill_id, title, domains, status = "sk-1", "filter dead groups", ("math",), "validated"
        template: ClassVar[dict] = {"factor": "filter", "group_filter": {"kind": "std_ema"}}

        def markdown(self):
            return "# filter dead groups\nwhen R1 fires"

    class SkillLibrary:
        @classmethod
        def open(cls, root=None):
            return cls()

        def retrieve(self, findings, domain, *, tried=()):
            calls.append(("retrieve", len(findings), domain, tried))
            return [Skill()]

    skills = types.ModuleType("evotrainer.skills")
    skills.SkillLibrary = SkillLibrary
    for name, mod in (("memory", memory), ("skills", skills)):
        monkeypatch.setitem(sys.modules, f"evotrainer.{name}", mod)
        monkeypatch.setattr(evotrainer, name, mod, raising=False)
    text, err = box.call("read_memory", {})
    assert not err and "v000 promoted" in text and "dead groups everywhere" in text
    assert box.call("write_memory", {"text": "try filters next"}) == ("noted", False)
    text, err = box.call("search_skills", {})
    assert not err and "sk-1" in text and "when R1 fires" in text
    box.call("health_report", {"version": "v000"})
    assert ("note", "try filters next", "claude") in calls
    assert ("retrieve", len(ctx.health.findings), "math", ()) in calls
    assert ("search", "health_report", "v000", "claude") in calls and ("search", "search_skills", "skills", "claude") in calls


def test_retry_backoff_and_non_retryable_errors(ctx, fake, monkeypatch):
    from evotrainer.agent.claude import ClaudeAgent

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    err503 = {"status": 503, "body": {"type": "error", "error": {"type": "api_error", "message": "unavailable"}}}
    fake.reset()
    fake.queue.extend([err503, err503])
    waits: list[float] = []
    spec = schema.ClaudeAgentSpec(model=MODEL, max_retries=1, backoff_base_s=0.02, budget_usd=1.0)
    agent = ClaudeAgent(spec, log=lambda s: None, sleep=waits.append)
    ivs = agent.propose(ctx)
    assert len(fake.requests) == 2 and len(waits) == 1 and 0.01 <= waits[0] <= 0.02  # jittered base delay
    assert ivs and all(iv.author == "playbook" for iv in ivs)
    # A 400 is not retried.
    fake.reset()
    fake.queue.append({"status": 400, "body": {"type": "error", "error": {"type": "invalid_request_error",
                                                                          "message": "bad"}}})
    waits.clear()
    assert agent.propose(ctx) and len(fake.requests) == 1 and not waits
    usage = events(ctx.store, "agent_usage")
    assert [u.outcome for u in usage] == ["fallback", "fallback"] and "HTTP 400" in usage[-1].reason
    # A malformed ranking falls back to the playbook's order.
    fake.reset()
    fake.queue.append({"status": 200, "body": {
        "id": "msg_x", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "tool_use",
        "stop_sequence": None, "content": [{"type": "tool_use", "id": "toolu_x", "name": "rank_candidates",
                                            "input": {"intervention_ids": ["iv-000000000000"]}}],
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0}}})
    pairs = [(iv, None) for iv in ivs[:2]]
    if len(pairs) == 2:
        assert agent.rank(ctx, pairs) == pairs
        assert events(ctx.store, "agent_usage")[-1].outcome == "fallback"


def test_config_schema_and_old_ledgers(tmp_path, data_dir):
    from evotrainer import config as config_mod
    from evotrainer.controller import campaign_spec

    cfg = tmp_path / "c.toml"
    cfg.write_text('agent = "claude"\n[claude]\nbudget_usd = 1.5\non_api_failure = "wait"\nbase_url = "http://x"\n'
                   '[claude.prices]\ninput_per_mtok = 1.0\n')
    rc = config_mod.load(cfg, "smoke")
    assert rc.agent == "claude" and rc.claude.budget_usd == 1.5 and rc.claude.on_api_failure == "wait"
    assert rc.claude.prices.input_per_mtok == 1.0 and rc.claude.prices.output_per_mtok == 15.0
    spec = campaign_spec(rc, "x", "smoke")
    assert spec.claude == rc.claude
    cfg.write_text("[claude]\nbudget = 1\n")
    with pytest.raises(config_mod.ConfigError, match="claude.budget"):
        config_mod.load(cfg, "smoke")
    cfg.write_text('[claude]\non_api_failure = "retry"\n')
    with pytest.raises(config_mod.ConfigError, match="on_api_failure"):
        config_mod.load(cfg, "smoke")
    # A campaign.json written before the claude section existed still opens (with the defaults).
    from evotrainer.testing import temp_store

    store = temp_store(tmp_path / "old")
    raw = json.loads((store.root / "campaign.json").read_text())
    raw.pop("claude")
    (store.root / "campaign.json").write_text(json.dumps(raw))
    assert Store.open(store.root).campaign.claude == schema.ClaudeAgentSpec()
    # A ledger with agent_usage events loads and replays; status and loop state ignore the kind.
    store.ledger.append(schema.AgentUsage(version="v001", agent="claude", model=MODEL, phase="propose", calls=2,
                                          input_tokens=10, output_tokens=5, cost_usd=0.001))
    evs = store.ledger.events()
    assert evs[-1].kind == "agent_usage" and derive(evs, "test").status.versions == {}
    # --agent claude without a key is refused before anything is written.
    res = cli("run", "--preset", "smoke", "--campaign", str(tmp_path / "nokey"), "--agent", "claude",
              data_dir=data_dir)
    assert res.returncode == 2 and "ANTHROPIC_API_KEY" in res.stderr and not (tmp_path / "nokey").exists()


# --------------------------------------------------------------------------- live


@pytest.mark.live_api
def test_live_propose_round(tmp_path, data_dir, monkeypatch):
    """One real propose round on a smoke campaign (runs only with ANTHROPIC_API_KEY set)."""
    if not os.environ.get("ANTHROPIC_API_KEY"):
        pytest.skip("ANTHROPIC_API_KEY is not set")
    from evotrainer import interventions
    from evotrainer.agent.claude import ClaudeAgent

    camp = tmp_path / "live"
    res = cli("run", "--preset", "smoke", "--campaign", str(camp), "--versions", "1", data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    store = Store.open(camp)
    ctx = AgentContext.build(store, derive(store.ledger.events(), store.campaign.name), "v001", "v000")
    spec = schema.ClaudeAgentSpec(model=os.environ.get("EVOTRAINER_LIVE_MODEL", "claude-sonnet-4-5"),
                                  budget_usd=1.0, max_tool_rounds=10, on_api_failure="wait")
    lines: list[str] = []
    ivs = ClaudeAgent(spec, log=lines.append).propose(ctx)
    assert ivs, "\n".join(lines)
    (usage,) = events(store, "agent_usage")
    assert usage.outcome == "answered" and usage.calls >= 1 and usage.cost_usd > 0, "\n".join(lines)
    for iv in ivs:
        assert iv.author == "claude" and iv.parent == "v000"
        interventions.apply(iv, ctx.parent_spec.harness, ctx.parent_spec.train)
