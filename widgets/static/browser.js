function render({ model, el }) {
  const root = h("div", { class: "evo-root evo-rollout-browser", tabindex: 0, "data-lm-suppress-shortcuts": "true", "data-p-suppress-shortcuts": "true" });
  const form = h("div", { class: "evo-section evo-filters" });
  const pager = h("div", { class: "evo-section evo-pager" });
  const body = h("div", { class: "evo-section evo-body" });
  root.append(form, messageBar(model), pager, body);
  el.append(root);

  // ---- filter form (built once; values follow the `filters` trait)
  const inp = (name, ph, type) => h("input", { name, placeholder: ph, type: type || "text", "data-filter": name });
  const versionSel = h("select", { name: "versions", "data-filter": "versions" });
  const splitSel = h("select", { name: "split", "data-filter": "split" }, h("option", { value: "" }, "any split"));
  const correctSel = h("select", { name: "correct", "data-filter": "correct" }, ["any", "yes", "no"].map((v) => h("option", { value: v }, "correct: " + v)));
  const findingSel = h("select", { name: "finding_id", "data-filter": "finding_id" });
  const fields = { step_min: inp("step_min", "step ≥", "number"), step_max: inp("step_max", "step ≤", "number"),
    reward_min: inp("reward_min", "reward ≥", "number"), reward_max: inp("reward_max", "reward ≤", "number"), text: inp("text", "text in prompt/completion") };
  const collect = () => {
    const num = (e) => (e.value === "" ? null : Number(e.value));
    return { versions: versionSel.value ? [versionSel.value] : [], split: splitSel.value || null, correct: correctSel.value,
      finding_id: findingSel.value || null, step_min: num(fields.step_min), step_max: num(fields.step_max),
      reward_min: num(fields.reward_min), reward_max: num(fields.reward_max), text: fields.text.value };
  };
  const apply = () => send(model, "set_filters", collect());
  for (const e of [versionSel, splitSel, correctSel, findingSel]) e.addEventListener("change", apply);
  for (const e of Object.values(fields)) e.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.stopPropagation(); apply(); } });
  form.append(versionSel, splitSel, fields.step_min, fields.step_max, fields.reward_min, fields.reward_max, correctSel, findingSel, fields.text,
    btn(model, "set_filters", "Filter", collect), btn(model, "clear_filters", "Clear"));

  redrawOn(model, ["options"], () => {
    const o = model.get("options") || {};
    clear(versionSel); versionSel.append(h("option", { value: "" }, "all versions"), ...(o.versions || []).map((v) => h("option", { value: v }, v)));
    clear(splitSel); splitSel.append(h("option", { value: "" }, "any split"), ...(o.splits || []).map((v) => h("option", { value: v }, v)));
    clear(findingSel); findingSel.append(h("option", { value: "" }, "any finding"), ...(o.findings || []).map((f) => h("option", { value: f.finding_id }, `${f.version} ${f.severity} ${f.code} (${f.n})`)));
    syncForm();
  });
  function syncForm() {
    const f = model.get("filters") || {};
    versionSel.value = (f.versions && f.versions.length === 1) ? f.versions[0] : "";
    splitSel.value = f.split || ""; correctSel.value = f.correct || "any"; findingSel.value = f.finding_id || "";
    for (const [k, e] of Object.entries(fields)) if (document.activeElement !== e) e.value = (f[k] === null || f[k] === undefined) ? "" : f[k];
  }
  model.on("change:filters", syncForm);

  // ---- pager
  redrawOn(model, ["page", "n_pages", "total", "view"], () => {
    clear(pager);
    pager.append(btn(model, "prev_page", "‹ Prev"), h("span", { class: "evo-total", "data-total": model.get("total") },
      ` ${model.get("total").toLocaleString()} rollouts · page ${model.get("n_pages") ? model.get("page") + 1 : 0} of ${model.get("n_pages")} `),
      btn(model, "next_page", "Next ›"),
      ...["table", "group", "turns", "item"].map((v) => btn(model, "set_view", v, { view: v }, { class: "evo-btn" + (model.get("view") === v ? " evo-active" : "") })),
      h("span", { class: "evo-muted" }, "  keys: j/k or ↑/↓ move · Enter opens group · Esc back · h/l turns"));
  });

  // ---- body by view
  function drawTable() {
    const rows = model.get("rows") || [], cur = model.get("cursor");
    const cols = ["step", "version", "split", "item_id", "sample_idx", "reward", "correct", "advantage", "filtered", "truncated", "completion_head"];
    const tbl = h("table", { class: "evo-rollout-table" }, h("tr", {}, cols.map((c) => h("th", {}, c))));
    rows.forEach((r, i) => {
      const tr = h("tr", { class: "evo-rollout-row" + (i === cur ? " evo-row-selected" : ""), "data-uid": r.rollout_uid, "data-group": r.group_id, "data-index": i },
        cols.map((c) => h("td", { class: c === "completion_head" ? "evo-text-cell" : "" }, fmt(r[c]))),
        h("td", { class: "evo-group-link", "data-group-id": r.group_id, title: "open this group", style: "cursor:pointer;text-decoration:underline",
          onclick: (e) => { e.stopPropagation(); send(model, "select_group", { group_id: r.group_id }); } }, r.group_id),
        h("td", {}, btn(model, "select_group", "group", { group_id: r.group_id }), btn(model, "select_rollout", "turns", { uid: r.rollout_uid }), btn(model, "follow_item", "item", { item_id: r.item_id })));
      tr.addEventListener("click", () => send(model, "select_row", { index: i }));
      tr.addEventListener("dblclick", () => send(model, "select_group", { group_id: r.group_id }));
      tbl.append(tr);
    });
    return tbl;
  }
  function drawGroup() {
    const g = model.get("group") || {};
    if (!g.group_id) return h("em", {}, "no group selected (Enter on a row)");
    const box = h("div", { class: "evo-group-view", "data-group-id": g.group_id },
      h("div", {}, h("strong", {}, g.group_id), ` · item ${g.item_id} · ${g.n} samples · reward mean ${fmt(g.reward_mean)} std ${fmt(g.reward_std)}`,
        g.dead ? h("span", { class: "evo-badge evo-sev-warning" }, "dead group") : null, ` · ${g.n_correct} correct · ${g.n_filtered} filtered `,
        btn(model, "move", "‹ prev group", { delta: -1 }), btn(model, "move", "next group ›", { delta: 1 }), btn(model, "back", "back to table")),
      h("details", {}, h("summary", {}, "prompt"), h("div", { class: "evo-text" }, g.prompt)));
    const samples = h("div", { class: "evo-samples" });
    for (const s of g.samples || []) {
      samples.append(h("div", { class: "evo-sample" + (s.correct ? " evo-correct" : "") + (s.filtered ? " evo-filtered" : ""), "data-uid": s.rollout_uid, "data-sample-idx": s.sample_idx },
        h("div", {}, h("strong", {}, "#" + s.sample_idx), ` reward ${fmt(s.reward)} · advantage ${s.advantage_text}`),
        h("div", {}, (g.components || []).map((c) => h("span", { class: "evo-badge" }, `${c} ${fmt(s[c])}`))),
        h("div", {}, `correct ${fmt(s.correct)} · logp ${fmt(s.mean_logprob)} · ${fmt(s.n_completion_tokens)} tok`, s.truncated ? h("span", { class: "evo-badge evo-sev-warning" }, "truncated") : null,
          s.filtered ? h("span", { class: "evo-badge evo-sev-info" }, "filtered: " + (s.filter_reason || "")) : null),
        h("div", { class: "evo-text" }, s.completion),
        btn(model, "select_rollout", "turns", { uid: s.rollout_uid })));
    }
    box.append(samples);
    return box;
  }
  function drawTurns() {
    const turns = model.get("turns") || [], ti = model.get("turn_index"), r = model.get("rollout") || {};
    if (!turns.length) return h("em", {}, "no rollout selected");
    return h("div", { class: "evo-turns-view", "data-uid": r.rollout_uid },
      h("div", {}, h("strong", {}, r.rollout_uid), ` · reward ${fmt(r.reward)} · correct ${fmt(r.correct)} · turn ${ti + 1} of ${turns.length} `,
        btn(model, "turn", "‹ prev turn", { delta: -1 }), btn(model, "turn", "next turn ›", { delta: 1 }), btn(model, "select_group", "group", { group_id: r.group_id }), btn(model, "back", "back")),
      turns.map((t, i) => h("div", { class: "evo-turn" + (i === ti ? " evo-turn-current" : ""), "data-turn": t.turn_idx },
        h("div", {}, h("span", { class: "evo-badge" }, t.role), t.tool_name ? ` tool ${t.tool_name}(${t.tool_args || ""}) ok=${fmt(t.tool_ok)}` : "", ` · ${fmt(t.n_tokens)} tok · logp ${fmt(t.mean_logprob)}`),
        i <= ti ? h("div", { class: "evo-text" }, t.text || "", t.tool_output ? "\n→ " + t.tool_output : "") : null)));
  }
  function drawItem() {
    const it = model.get("item_history") || {};
    if (!it.item_id) return h("em", {}, "no item followed");
    return h("div", { class: "evo-item-view", "data-item": it.item_id }, h("strong", {}, `item ${it.item_id}: ${it.n} rollouts`), btn(model, "back", "back"),
      (it.versions || []).map((v) => h("div", { class: "evo-item-version", "data-version": v.version },
        h("h4", {}, `${v.version}: ${v.n} rollouts (${v.n_train} train, ${v.n_val} val) · share correct ${pct(v.share_correct)} · reward ${fmt(v.reward_mean)}`),
        h("table", {}, h("tr", {}, ["split", "step", "sample", "reward", "correct", "completion"].map((c) => h("th", {}, c))),
          v.rollouts.map((r) => h("tr", { "data-uid": r.rollout_uid, onclick: () => send(model, "select_rollout", { uid: r.rollout_uid }) },
            [r.split, r.step, r.sample_idx, fmt(r.reward), fmt(r.correct), r.completion].map((x) => h("td", {}, fmt(x)))))))));
  }
  redrawOn(model, ["view", "rows", "cursor", "group", "turns", "turn_index", "item_history"], () => {
    clear(body);
    const v = model.get("view");
    body.append(v === "group" ? drawGroup() : v === "turns" ? drawTurns() : v === "item" ? drawItem() : drawTable());
  });

  // ---- keyboard: intents only; Python moves the cursor
  root.addEventListener("keydown", (ev) => {
    if (ev.target && (ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT" || ev.target.tagName === "TEXTAREA")) return;
    const k = ev.key;
    let handled = true;
    if (k === "j" || k === "ArrowDown") send(model, "move", { delta: 1 });
    else if (k === "k" || k === "ArrowUp") send(model, "move", { delta: -1 });
    else if (k === "Enter") send(model, "open_selected");
    else if (k === "Escape") send(model, "back");
    else if (k === "l" || k === "ArrowRight") send(model, "turn", { delta: 1 });
    else if (k === "h" || k === "ArrowLeft") send(model, "turn", { delta: -1 });
    else if (k === "n" || k === "PageDown") send(model, "next_page");
    else if (k === "p" || k === "PageUp") send(model, "prev_page");
    else handled = false;
    if (handled) { ev.preventDefault(); ev.stopPropagation(); }
  });
}
export default { render };
