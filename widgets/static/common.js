// Shared helpers for the EvoTrainer widgets (prepended to each widget's module by Python).
// Views only render what Python computed and send intents: model.send({action, args}).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}
function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(digits);
  if (typeof x === "boolean") return x ? "yes" : "no";
  return String(x);
}
function pct(x) { return (x === null || x === undefined) ? "–" : (100 * x).toFixed(1) + "%"; }
function send(model, action, args) { model.send({ action, args: args || {} }); }
function btn(model, action, label, args, attrs) {
  const a = Object.assign({ class: "evo-btn", "data-action": action, type: "button" }, attrs || {});
  a.onclick = (e) => { e.stopPropagation(); send(model, action, typeof args === "function" ? args() : args); };
  return h("button", a, label);
}
function messageBar(model) {
  const bar = h("div", { class: "evo-message" });
  const draw = () => {
    bar.textContent = model.get("message") || "";
    bar.className = "evo-message evo-message-" + (model.get("message_kind") || "info");
  };
  model.on("change:message", draw);
  model.on("change:message_kind", draw);
  draw();
  return bar;
}
function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }
function redrawOn(model, names, fn) { for (const n of names) model.on("change:" + n, fn); fn(); }
