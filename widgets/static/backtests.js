function histSvg(hg) {
  const ns = "http://www.w3.org/2000/svg", W = 260, H = 90, B = 14;
  const mk = (tag, attrs) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; };
  const svg = mk("svg", { width: W, height: H, class: "evo-hist" });
  const n = hg.centers.length; if (!n) return svg;
  const max = Math.max(1, ...hg.before, ...hg.after), bw = (W - 4) / n;
  hg.centers.forEach((c, i) => {
    const hb = (H - B) * hg.before[i] / max, ha = (H - B) * hg.after[i] / max;
    svg.append(mk("rect", { x: 2 + i * bw, y: H - B - hb, width: bw * 0.45, height: hb, fill: "#90a4ae" }));
    svg.append(mk("rect", { x: 2 + i * bw + bw * 0.45, y: H - B - ha, width: bw * 0.45, height: ha, fill: "#1976d2" }));
  });
  const lo = mk("text", { x: 2, y: H - 2, "font-size": 10 }); lo.textContent = hg.centers[0].toFixed(2); svg.append(lo);
  const hi = mk("text", { x: W - 30, y: H - 2, "font-size": 10 }); hi.textContent = hg.centers[n - 1].toFixed(2); svg.append(hi);
  return svg;
}
function render({ model, el }) {
  const root = h("div", { class: "evo-root evo-backtest-compare" });
  const cards = h("div", { class: "evo-cards" });
  root.append(h("div", {}, h("strong", {}, "Backtests: candidates side by side "), btn(model, "refresh", "Refresh")), messageBar(model), cards);
  el.append(root);
  redrawOn(model, ["candidates", "histograms"], () => {
    clear(cards);
    const hists = model.get("histograms") || {};
    for (const c of model.get("candidates") || []) {
      const hg = hists[c.backtest_id];
      const row = (label, b, a, f) => h("tr", {}, h("th", {}, label), h("td", {}, f(b)), h("td", {}, f(a)));
      cards.append(h("div", { class: "evo-candidate evo-verdict-" + c.verdict, "data-backtest": c.backtest_id, "data-intervention": c.intervention_id || "" },
        h("div", {}, h("strong", {}, (c.rank !== null && c.rank !== undefined ? "#" + c.rank + " " : "") + (c.intervention_id || c.backtest_id)),
          h("span", { class: "evo-badge evo-verdict", "data-verdict": c.verdict }, c.verdict), c.selected ? h("span", { class: "evo-badge" }, "selected") : null),
        h("div", { class: "evo-change" }, c.change || ""),
        h("div", { class: "evo-hypothesis" }, h("em", {}, c.hypothesis || "")),
        h("div", {}, "criterion: " + (c.success_criterion || "–") + " · on " + (c.versions || []).join(", ")),
        h("table", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "before"), h("th", {}, "after")),
          row("DGR", c.dgr_before, c.dgr_after, pct), row("effective data", c.effective_data_before, c.effective_data_after, pct),
          row("reward mean", c.reward_mean_before, c.reward_mean_after, fmt), row("reward spread", c.reward_spread_before, c.reward_spread_after, fmt)),
        h("div", {}, `groups rescued ${c.groups_rescued} · killed ${c.groups_killed} · order violations ${c.order_violations} · sign flips ${c.advantage_sign_flips} · correct wrongly filtered ${c.correct_wrongly_filtered}`),
        hg && hg.centers ? h("div", {}, h("div", {}, "reward distribution (grey before, blue after)"), histSvg(hg)) : (hg && hg.error ? h("div", { class: "evo-message-error" }, hg.error) : null),
        h("ul", { class: "evo-reasons" }, (c.reasons || []).map((r) => h("li", {}, r))),
        h("div", { class: "evo-note" }, h("small", {}, c.counterfactual_note))));
    }
  });
}
export default { render };
