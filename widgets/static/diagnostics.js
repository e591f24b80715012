function render({ model, el }) {
  const root = h("div", { class: "evo-root evo-diagnostic-editor" });
  const src = h("textarea", { class: "evo-source", name: "source", "data-field": "source", spellcheck: "false" });
  let dirty = false;
  src.addEventListener("input", () => { dirty = true; });
  const pushSource = () => { if (dirty) { model.set("source", src.value); model.save_changes(); dirty = false; } };
  src.addEventListener("blur", pushSource);
  const picker = h("select", { name: "versions", multiple: true, class: "evo-version-picker", size: 3 });
  picker.addEventListener("change", () => send(model, "set_versions", { versions: Array.from(picker.selectedOptions).map((o) => o.value) }));
  const name = h("input", { name: "name", "data-field": "name", placeholder: "name (a-z0-9_)" });
  const author = h("input", { name: "author", "data-field": "author", placeholder: "author" });
  const reason = h("input", { name: "reason", "data-field": "reason", placeholder: "reason", style: "width:260px" });
  const runBtn = btn(model, "run", "Run", () => { pushSource(); return { source: src.value }; });
  const saveBtn = btn(model, "save", "Save revision", () => { pushSource(); return { name: name.value, author: author.value, reason: reason.value }; });
  const metric = h("input", { name: "metric", "data-field": "metric", placeholder: "metric (optional)", style: "width:120px" });
  // validates the saved revision (loaded or last saved): Python picks it and runs the replay
  const validateBtn = btn(model, "validate", "Validate", () => ({ name: name.value, who: author.value, reason: reason.value, metric: metric.value }));
  const resultBox = h("div", { class: "evo-section evo-result" });
  const valBox = h("div", { class: "evo-section evo-validation" });
  const revBox = h("div", { class: "evo-section evo-revisions" });
  root.append(src, h("div", { class: "evo-section" }, "versions ", picker, " ", runBtn, h("span", { class: "evo-running" }), " · ", name, author, reason, saveBtn,
    " · ", metric, validateBtn, h("span", { class: "evo-validating" })),
    messageBar(model), resultBox, valBox, revBox);
  el.append(root);

  redrawOn(model, ["source"], () => { if (!dirty && document.activeElement !== src) src.value = model.get("source"); });
  redrawOn(model, ["version_options", "selected_versions"], () => {
    const sel = new Set(model.get("selected_versions") || []);
    clear(picker);
    for (const v of model.get("version_options") || []) { const o = h("option", { value: v }, v); o.selected = sel.has(v); picker.append(o); }
  });
  redrawOn(model, ["name", "author", "reason"], () => {
    for (const [e, k] of [[name, "name"], [author, "author"], [reason, "reason"]]) if (document.activeElement !== e) e.value = model.get(k) || "";
  });
  redrawOn(model, ["running"], () => { runBtn.disabled = !!model.get("running"); root.querySelector(".evo-running").textContent = model.get("running") ? " running…" : ""; });
  redrawOn(model, ["result", "linked"], () => {
    clear(resultBox);
    const r = model.get("result");
    if (!r) return;
    resultBox.append(h("div", { class: r.ok ? "evo-message-ok" : "evo-message-error", "data-ok": String(!!r.ok) }, r.ok ? `ok in ${fmt(r.seconds, 2)}s` : (r.error || "failed")));
    if ((r.metrics || []).length) resultBox.append(h("table", { class: "evo-metrics" }, h("tr", {}, h("th", {}, "metric"), h("th", {}, "value")),
      r.metrics.map((m) => h("tr", { "data-metric": m.name }, h("td", {}, m.name), h("td", {}, fmt(m.value))))));
    for (const f of r.findings || []) resultBox.append(h("div", { class: "evo-finding", "data-index": f.index },
      h("span", { class: "evo-badge evo-sev-" + (f.severity || "info") }, f.severity || "info"), h("strong", {}, (f.code || "") + ": "), f.message || "",
      model.get("linked") && f.n_examples ? btn(model, "open_finding", `show ${f.n_examples} rollouts`, { index: f.index }) : null));
    if (r.stdout) resultBox.append(h("details", {}, h("summary", {}, "stdout"), h("div", { class: "evo-text" }, r.stdout)));
  });
  redrawOn(model, ["validating"], () => { validateBtn.disabled = !!model.get("validating"); root.querySelector(".evo-validating").textContent = model.get("validating") ? " validating…" : ""; });
  redrawOn(model, ["validation"], () => {
    clear(valBox);
    const v = model.get("validation");
    if (!v) return;
    if (!v.ok) { valBox.append(h("div", { class: "evo-message-error", "data-accepted": "error" }, `validation failed: ${v.error || "unknown error"}`)); return; }
    valBox.append(h("h4", {}, `Validation of ${v.name} ${v.sha256.slice(0, 12)} (${v.validation_id}, by ${v.author}, as of ${v.as_of})`));
    valBox.append(h("div", { class: "evo-verdict " + (v.accepted ? "evo-message-ok" : "evo-message-error"), "data-accepted": String(!!v.accepted) },
      h("strong", {}, v.accepted ? "ACCEPTED" : "REJECTED"), ": ", v.why));
    valBox.append(h("div", {}, `signal ${fmt(v.signal)} · Cliff's δ ${fmt(v.cliffs_delta, 2)} · AUC ${fmt(v.auc, 2)} · Cohen's d ${v.cohens_d === null && v.cohens_d_note ? v.cohens_d_note : fmt(v.cohens_d, 2)} · ${v.n_kept} kept, ${v.n_bad} bad, ${v.n_unused} unused`));
    const cols = v.columns || [];
    valBox.append(h("table", { class: "evo-validation-table" },
      h("tr", {}, h("th", {}, "version"), h("th", {}, "label"), h("th", {}, "outcome"), cols.map((c) => h("th", {}, c)), h("th", {}, "note")),
      (v.rows || []).map((r) => h("tr", { class: "evo-label-" + r.label, "data-version": r.version, "data-label": r.label },
        h("td", {}, r.version), h("td", {}, r.label), h("td", {}, fmt(r.outcome)), (r.values || []).map((x) => h("td", {}, fmt(x))),
        h("td", {}, r.error ? `error: ${r.error}` : (r.note || ""))))));
    if (v.hidden_columns) valBox.append(h("div", {}, `${v.hidden_columns} more signal(s) not shown as columns`));
    if ((v.effects || []).length) valBox.append(h("details", {}, h("summary", {}, `effect sizes (${v.effects.length} signals)`),
      h("table", { class: "evo-effects" },
        h("tr", {}, ["signal", "passed", "kept mean", "bad mean", "Cliff's δ", "AUC", "Cohen's d", "why"].map((c) => h("th", {}, c))),
        v.effects.map((e) => h("tr", { "data-signal": e.signal, class: e.deciding ? "evo-deciding" : null },
          h("td", {}, e.signal), h("td", {}, fmt(e.passed)), h("td", {}, fmt(e.mean_kept)), h("td", {}, fmt(e.mean_bad)),
          h("td", {}, fmt(e.cliffs_delta, 2)), h("td", {}, fmt(e.auc, 2)), h("td", {}, e.cohens_d === null && e.cohens_d_note ? e.cohens_d_note : fmt(e.cohens_d, 2)),
          h("td", {}, e.why))))));
    if (v.rule) valBox.append(h("details", {}, h("summary", {}, "the rule"), h("div", { class: "evo-text" }, v.rule)));
  });
  redrawOn(model, ["revisions"], () => {
    clear(revBox);
    const revs = model.get("revisions") || [];
    revBox.append(h("h4", {}, `Saved revisions (${revs.length})`));
    for (const r of revs) revBox.append(h("div", { class: "evo-revision", "data-sha": r.sha256, "data-validated": String(!!r.validated) },
      h("span", { class: "evo-badge " + (r.validated ? "evo-validated" : "evo-unvalidated") }, r.validated ? "validated" : "not validated"),
      `${r.created_at} ${r.name} ${r.sha256.slice(0, 12)} by ${r.author}: ${r.reason} `, btn(model, "load_revision", "load", { sha256: r.sha256 })));
  });
}
export default { render };
