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
  const resultBox = h("div", { class: "evo-section evo-result" });
  const revBox = h("div", { class: "evo-section evo-revisions" });
  root.append(src, h("div", { class: "evo-section" }, "versions ", picker, " ", runBtn, h("span", { class: "evo-running" }), " · ", name, author, reason, saveBtn),
    messageBar(model), resultBox, revBox);
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
  redrawOn(model, ["revisions"], () => {
    clear(revBox);
    const revs = model.get("revisions") || [];
    revBox.append(h("h4", {}, `Saved revisions (${revs.length})`));
    for (const r of revs) revBox.append(h("div", { class: "evo-revision", "data-sha": r.sha256 }, `${r.created_at} ${r.name} ${r.sha256.slice(0, 12)} by ${r.author}: ${r.reason} `, btn(model, "load_revision", "load", { sha256: r.sha256 })));
  });
}
export default { render };
