function curveSvg(pts, domain) {
  const W = 420, H = 180, L = 40, R = 10, T = 10, B = 26;
  const ns = "http://www.w3.org/2000/svg";
  const mk = (tag, attrs) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; };
  const svg = mk("svg", { width: W, height: H, class: "evo-curve" });
  const [lo, hi] = domain && domain.length === 2 ? domain : [0, 1];
  const n = pts.length;
  const x = (i) => L + (n <= 1 ? (W - L - R) / 2 : i * (W - L - R) / (n - 1));
  const y = (v) => T + (H - T - B) * (1 - (v - lo) / ((hi - lo) || 1));
  svg.append(mk("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#999" }));
  svg.append(mk("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999" }));
  for (const v of [lo, hi]) { const t = mk("text", { x: 2, y: y(v) + 4, "font-size": 10 }); t.textContent = v.toFixed(2); svg.append(t); }
  let path = "";
  pts.forEach((p, i) => {
    if (p.best_so_far !== null && p.best_so_far !== undefined) path += (path ? " H " + x(i) + " V " : "M " + x(i) + " ") + y(p.best_so_far);
  });
  if (path) svg.append(mk("path", { d: path, fill: "none", stroke: "#1976d2", "stroke-width": 2, class: "evo-best-so-far" }));
  const colours = { promote: "#2e7d32", reject: "#c62828", inconclusive: "#f9a825", vetoed: "#6a1b9a", pending: "#9e9e9e", failed: "#000" };
  pts.forEach((p, i) => {
    if (p.ci_low !== null && p.ci_high !== null) svg.append(mk("line", { x1: x(i), x2: x(i), y1: y(p.ci_low), y2: y(p.ci_high), stroke: "#555", class: "evo-ci" }));
    const c = mk("circle", { cx: x(i), cy: y(p.avg_at_k), r: 4, fill: colours[p.colour] || "#888", "data-version": p.version });
    const tt = mk("title", {}); tt.textContent = `${p.version}: Avg@k ${p.avg_at_k.toFixed(3)}` + (p.ci_low !== null ? ` (CI ${p.ci_low.toFixed(3)}..${p.ci_high.toFixed(3)})` : ""); c.append(tt);
    svg.append(c);
    const lab = mk("text", { x: x(i) - 12, y: H - 8, "font-size": 10 }); lab.textContent = p.version; svg.append(lab);
  });
  return svg;
}

function render({ model, el }) {
  const root = h("div", { class: "evo-root evo-campaign-view" });
  const head = h("div", { class: "evo-section evo-controls" });
  const liveBox = h("div", { class: "evo-section evo-live" });
  const lineage = h("div", { class: "evo-section evo-lineage" });
  const curveBox = h("div", { class: "evo-section evo-curve-box" });
  const alertsBox = h("div", { class: "evo-section evo-alerts" });
  root.append(head, messageBar(model), liveBox, lineage, curveBox, alertsBox);
  el.append(root);

  redrawOn(model, ["campaign", "running", "paused", "aborted", "gate", "last_refresh"], () => {
    clear(head);
    const gate = model.get("gate");
    head.append(
      h("strong", {}, "campaign " + model.get("campaign") + " "),
      h("span", { class: "evo-badge evo-run-state" }, model.get("aborted") ? "aborted" : model.get("running") ? (model.get("paused") ? "pausing" : "running") : "idle"),
      gate ? h("span", { class: "evo-badge evo-sev-warning evo-gate" }, `waiting: ${gate.version} at the ${gate.gate} gate`) : null,
      btn(model, "pause", "Pause"), btn(model, "resume", "Resume"), btn(model, "stop", "Stop"), btn(model, "refresh", "Refresh"),
      h("span", { class: "evo-muted" }, " refreshed " + model.get("last_refresh")));
  });

  redrawOn(model, ["live"], () => {
    clear(liveBox);
    const lv = model.get("live") || {};
    if (!lv.version) { liveBox.append(h("em", {}, "no version in flight")); return; }
    liveBox.append(h("span", {}, `${lv.version} step ${lv.step} / ${lv.max_steps} `),
      h("span", { class: "evo-progress", "data-progress": fmt(lv.progress) }, h("div", { style: `width:${Math.round(100 * (lv.progress || 0))}%` })),
      h("span", {}, ` reward ${fmt(lv.reward)} · correct ${fmt(lv.correct)} · DGR ${pct(lv.dgr)}`));
  });

  redrawOn(model, ["versions"], () => {
    clear(lineage);
    const rows = model.get("versions") || [];
    const tbl = h("table", { class: "evo-lineage-table" },
      h("tr", {}, ["version", "state", "steps", "Avg@k", "decision", "alerts", "intervention"].map((c) => h("th", {}, c))));
    for (const r of rows) {
      tbl.append(h("tr", { class: "evo-version evo-outcome-" + r.colour, "data-version": r.version, "data-outcome": r.outcome || r.colour },
        h("td", { style: `padding-left:${6 + 16 * r.depth}px` }, (r.depth ? "└ " : "") + r.version, r.probe ? h("span", { class: "evo-badge evo-probe" }, r.probe_winner ? "probe ★" : "probe") : null, r.best ? h("span", { class: "evo-badge" }, "best") : null),
        h("td", {}, r.state),
        h("td", {}, `${r.steps}/${fmt(r.max_steps)}`),
        h("td", {}, r.avg_at_k === null ? "–" : `${fmt(r.avg_at_k)} (k=${r.k}, ${r.n_items} items)`),
        h("td", { title: r.decision_reason || "" }, r.outcome || r.colour, r.decided_by && r.decided_by !== "gate" ? ` (by ${r.decided_by})` : ""),
        h("td", {}, r.n_critical ? h("span", { class: "evo-badge evo-sev-critical" }, r.n_critical + " critical") : null, r.n_warning ? h("span", { class: "evo-badge evo-sev-warning" }, r.n_warning + " warning") : null),
        h("td", {}, r.intervention || "")));
    }
    lineage.append(tbl);
  });

  redrawOn(model, ["curve", "curve_domain"], () => {
    clear(curveBox);
    const pts = model.get("curve") || [];
    curveBox.append(h("h4", {}, "Avg@k (dots, CI bars from the gate) and best so far (line)"));
    if (pts.length) curveBox.append(curveSvg(pts, model.get("curve_domain"))); else curveBox.append(h("em", {}, "no evaluations yet"));
  });

  redrawOn(model, ["alerts"], () => {
    clear(alertsBox);
    const al = model.get("alerts") || [];
    alertsBox.append(h("h4", {}, `Health alerts (${al.length})`));
    for (const a of al) alertsBox.append(h("div", { class: "evo-alert", "data-finding": a.finding_id, "data-severity": a.severity },
      h("span", { class: "evo-badge evo-sev-" + a.severity }, a.severity), h("strong", {}, a.version + " " + a.code + ": "), a.message));
  });
}
export default { render };
