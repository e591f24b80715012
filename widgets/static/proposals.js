function render({ model, el }) {
  const root = h("div", { class: "evo-root evo-proposal-queue" });
  const gateBox = h("div", { class: "evo-section evo-gate-box" });
  const reason = h("input", { name: "reason", "data-field": "reason", placeholder: "reason (required)", class: "evo-reason", style: "width:320px" });
  const who = h("input", { name: "who", "data-field": "who", placeholder: "who (required)", class: "evo-who", style: "width:120px" });
  const resumeBox = h("input", { type: "checkbox", name: "auto_resume", class: "evo-auto-resume" });
  resumeBox.addEventListener("change", () => { model.set("auto_resume", resumeBox.checked); model.save_changes(); });
  const ctx = () => ({ reason: reason.value, who: who.value });
  const answerRow = h("div", { class: "evo-section evo-answer" }, "Reason ", reason, " Who ", who, " ",
    h("label", {}, resumeBox, " resume the campaign after answering "), btn(model, "resume", "Resume now"), btn(model, "refresh", "Refresh"));
  const evidenceBox = h("div", { class: "evo-section evo-evidence" });
  const propsBox = h("div", { class: "evo-section evo-cards evo-proposals" });
  const ownBox = h("div", { class: "evo-section evo-own" });
  const historyBox = h("div", { class: "evo-section evo-history" });
  root.append(gateBox, answerRow, messageBar(model), evidenceBox, propsBox, ownBox, historyBox);
  el.append(root);
  const edits = new Map();  // intervention id -> text being edited (view state only)

  redrawOn(model, ["who", "auto_resume"], () => { if (document.activeElement !== who) who.value = model.get("who") || ""; resumeBox.checked = !!model.get("auto_resume"); });

  redrawOn(model, ["gate", "decision", "alerts"], () => {
    clear(gateBox);
    const g = model.get("gate");
    if (!g) { gateBox.append(h("em", { class: "evo-no-gate" }, "the campaign is not waiting at a gate")); return; }
    gateBox.append(h("div", { class: "evo-gate", "data-gate": g.gate, "data-version": g.version }, h("strong", {}, `${g.version} waits at the ${g.gate} gate`),
      ` · subject: ${(g.subject || []).join(", ")} `,
      btn(model, "approve", "APPROVE", () => Object.assign({ index: null }, ctx())), btn(model, "abort", "ABORT", ctx)));
    const d = model.get("decision");
    if (g.gate === "completion") {
      if (d) gateBox.append(h("div", { class: "evo-decision", "data-outcome": d.outcome }, h("strong", {}, `gate decision: ${d.outcome}`), " · " + (d.reason || ""),
        d.stats ? h("div", {}, `Δ ${fmt(d.stats.mean_delta)} CI [${fmt(d.stats.ci_low)}, ${fmt(d.stats.ci_high)}] on ${d.stats.n_items} items · Wilcoxon p ${fmt(d.stats.p_wilcoxon)}`) : null));
      gateBox.append(h("div", {}, "override the outcome: ", ["promote", "reject", "inconclusive"].map((o) =>
        btn(model, "answer_completion", o, () => Object.assign({ outcome: o }, ctx()), { "data-outcome": o }))));
      for (const a of model.get("alerts") || []) gateBox.append(h("div", { class: "evo-alert", "data-finding": a.finding_id }, h("span", { class: "evo-badge evo-sev-" + a.severity }, a.severity), `${a.code}: ${a.message}`));
    }
  });

  redrawOn(model, ["findings"], () => {
    clear(evidenceBox);
    const fs = model.get("findings") || [];
    evidenceBox.append(h("h4", {}, `Evidence: findings cited (${fs.length})`));
    for (const f of fs) evidenceBox.append(h("div", { class: "evo-finding", "data-finding": f.finding_id },
      h("span", { class: "evo-badge evo-sev-" + f.severity }, f.severity), h("strong", {}, `${f.version} ${f.code}`), `: ${f.message} `, h("small", {}, `(cited by ${f.cited_by.join(", ") || "the gate"}; ${f.n_examples} example rollouts)`)));
  });

  redrawOn(model, ["proposals", "rejected"], () => {
    clear(propsBox);
    const rejected = new Set(model.get("rejected") || []);
    for (const p of model.get("proposals") || []) {
      const ta = h("textarea", { class: "evo-json", name: "intervention_json", "data-intervention": p.intervention_id });
      ta.value = edits.has(p.intervention_id) ? edits.get(p.intervention_id) : p.json;
      ta.addEventListener("input", () => edits.set(p.intervention_id, ta.value));
      propsBox.append(h("div", { class: "evo-proposal" + (rejected.has(p.index) ? " evo-rejected" : ""), "data-index": p.index, "data-intervention": p.intervention_id },
        h("div", {}, h("strong", {}, `#${p.rank} ${p.intervention_id}`), p.selected ? h("span", { class: "evo-badge" }, "selected") : null,
          p.verdict ? h("span", { class: "evo-badge evo-verdict", "data-verdict": p.verdict }, "backtest: " + p.verdict) : null),
        h("div", {}, p.description), h("div", {}, h("em", {}, p.hypothesis)),
        h("div", {}, `criterion: ${p.success_criterion} · rollback: ${p.rollback_plan} · evidence: ${(p.evidence || []).join(", ") || "–"}`),
        p.verdict ? h("div", {}, `DGR ${pct(p.dgr_before)} → ${pct(p.dgr_after)}`, h("ul", {}, (p.reasons || []).map((r) => h("li", {}, r)))) : null,
        h("details", {}, h("summary", {}, "edit JSON"), ta),
        h("div", {}, btn(model, "approve", "APPROVE", () => Object.assign({ index: p.index }, ctx()), { disabled: !p.actionable }),
          btn(model, "revise", "REVISE", () => Object.assign({ index: p.index, intervention_json: ta.value }, ctx()), { disabled: !p.actionable }),
          btn(model, "reject", "REJECT", () => Object.assign({ index: p.index }, ctx())))));
    }
    if (!(model.get("proposals") || []).length) propsBox.append(h("em", {}, "no proposals"));
  });

  const draft = h("textarea", { class: "evo-json evo-draft", name: "draft" });
  let draftTouched = false;
  draft.addEventListener("input", () => { draftTouched = true; });
  ownBox.append(h("h4", {}, "Write your own intervention (replaces the agent's candidates)"), draft,
    btn(model, "write", "Submit my intervention", () => Object.assign({ intervention_json: draft.value }, ctx())));
  redrawOn(model, ["draft"], () => { if (!draftTouched) draft.value = model.get("draft") || ""; });

  redrawOn(model, ["history"], () => {
    clear(historyBox);
    const hs = model.get("history") || [];
    historyBox.append(h("h4", {}, `Gate answers (${hs.length})`));
    for (const a of hs) historyBox.append(h("div", { class: "evo-answered" }, `${a.time} ${a.version} ${a.gate}: ${a.answer.toUpperCase()}${a.outcome ? " " + a.outcome : ""}${a.intervention_id ? " " + a.intervention_id : ""} by ${a.actor}: ${a.reason}`));
  });
}
export default { render };
