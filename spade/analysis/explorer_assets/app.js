/* spade explorer: the map of environments, one environment's source, hint, document and
   trajectories, rejected candidates, metric curves. Data arrives through spadeData(...) in data.js
   and spadeDetail(uid, ...) in details/KEY.js (script files, so the page also works from disk). */
"use strict";

var SVGNS = "http://www.w3.org/2000/svg";
var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
var SKILLS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"];
var MAP_W = 1000, MAP_H = 700, PAD = 30;

var state = {
  data: null, byUid: {}, details: {}, selected: null, tab: "source", arm: "nohint",
  zoom: { k: 1, x: 0, y: 0 }, pendingDetail: {}, reloadTimer: null
};

function $(id) { return document.getElementById(id); }
function esc(text) {
  return String(text == null ? "" : text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return (Math.round(v * 1000) / 1000).toFixed(digits === undefined ? 2 : digits);
  return String(v);
}
function el(tag, attrs, html) {
  var node = document.createElement(tag);
  for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
  if (html !== undefined) node.innerHTML = html;
  return node;
}
function svg(tag, attrs) {
  var node = document.createElementNS(SVGNS, tag);
  for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
  return node;
}
function loadScript(src) {
  var s = document.createElement("script");
  s.src = src;
  s.onload = function () { s.remove(); };
  s.onerror = function () { s.remove(); setStatus("could not load " + src); };
  document.body.appendChild(s);
}
function setStatus(text) { $("status").textContent = text; }

/* ------------------------------------------------------------------ colours */

function mix(a, b, t) {
  var pa = [parseInt(a.substr(1, 2), 16), parseInt(a.substr(3, 2), 16), parseInt(a.substr(5, 2), 16)];
  var pb = [parseInt(b.substr(1, 2), 16), parseInt(b.substr(3, 2), 16), parseInt(b.substr(5, 2), 16)];
  var c = pa.map(function (x, i) { return Math.round(x + (pb[i] - x) * t); });
  return "rgb(" + c.join(",") + ")";
}
function ramp(stops, t) {
  t = Math.max(0, Math.min(1, t));
  var n = stops.length - 1, i = Math.min(n - 1, Math.floor(t * n));
  return mix(stops[i], stops[i + 1], t * n - i);
}
var SEQ = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];
var WIN = ["#c0392b", "#f1c40f", "#27ae60"];
var DIV = ["#2166ac", "#f7f7f7", "#b2182b"];

function colourOf(env) {
  var by = $("colour").value, d = state.data;
  if (by === "run") return PALETTE[d.runs.map(function (r) { return r.name; }).indexOf(env.run) % PALETTE.length];
  if (by === "skill") return SKILLS[skillList().indexOf(env.skill) % SKILLS.length];
  if (by === "step") {
    var r = stepRange();
    return ramp(SEQ, r[1] > r[0] ? (env.generated_step - r[0]) / (r[1] - r[0]) : 0.5);
  }
  if (by === "win_rate") return env.win_rate == null ? "#aaaaaa" : ramp(WIN, env.win_rate);
  if (by === "regret") return env.regret == null ? "#aaaaaa" : ramp(DIV, (env.regret + 1) / 2);
  return "#555";
}
function skillList() {
  var seen = {};
  state.data.envs.forEach(function (e) { seen[e.skill] = 1; });
  return Object.keys(seen).sort();
}
function stepRange() {
  var steps = state.data.envs.map(function (e) { return e.generated_step; });
  return steps.length ? [Math.min.apply(null, steps), Math.max.apply(null, steps)] : [0, 0];
}
function drawLegend() {
  var by = $("colour").value, box = $("legend"), html = "";
  if (by === "run") {
    state.data.runs.forEach(function (r, i) { html += '<span class="sw" style="background:' + PALETTE[i % PALETTE.length] + '"></span>' + esc(r.name); });
  } else if (by === "skill") {
    skillList().forEach(function (s, i) { html += '<span class="sw" style="background:' + SKILLS[i % SKILLS.length] + '"></span>' + esc(s || "?"); });
  } else {
    var stops = by === "step" ? SEQ : by === "win_rate" ? WIN : DIV;
    var lo = by === "step" ? stepRange()[0] : by === "win_rate" ? 0 : -1;
    var hi = by === "step" ? stepRange()[1] : 1;
    html = esc(by.replace("_", " ")) + " " + lo + '<span class="ramp" style="background:linear-gradient(to right,' + stops.join(",") + ')"></span>' + hi +
      (by === "step" ? "" : ' <span class="sw" style="background:#aaa"></span>no plays');
  }
  box.innerHTML = html;
}

/* ------------------------------------------------------------------ filters and map */

function visible(env) {
  var run = $("f-run").value, skill = $("f-skill").value, text = $("f-text").value.trim().toLowerCase();
  var lo = $("f-min").value, hi = $("f-max").value;
  if (run && env.run !== run) return false;
  if (skill && env.skill !== skill) return false;
  if (lo !== "" && env.generated_step < Number(lo)) return false;
  if (hi !== "" && env.generated_step > Number(hi)) return false;
  if (text && (env.class_name || "").toLowerCase().indexOf(text) < 0 && env.env_id.toLowerCase().indexOf(text) < 0) return false;
  return true;
}
function fillSelect(select, values, keep) {
  var old = select.value;
  while (select.options.length > (keep ? 1 : 0)) select.remove(keep ? 1 : 0);
  values.forEach(function (v) { var o = document.createElement("option"); o.value = v; o.textContent = v || "?"; select.appendChild(o); });
  if (values.indexOf(old) >= 0 || (keep && old === "")) select.value = old;
}
function px(env) { return PAD + (env.x == null ? 0.5 : env.x) * (MAP_W - 2 * PAD); }
function py(env) { return PAD + (1 - (env.y == null ? 0.5 : env.y)) * (MAP_H - 2 * PAD); }

function drawMap() {
  var g = $("viewport");
  while (g.firstChild) g.removeChild(g.firstChild);
  var shown = 0, r = 6 / Math.sqrt(state.zoom.k), groups = {}, offset = {};
  // environments with the same source sit on the same spot: spread them on a small ring
  state.data.envs.forEach(function (env) {
    var key = px(env).toFixed(1) + "," + py(env).toFixed(1);
    (groups[key] = groups[key] || []).push(env.uid);
  });
  Object.keys(groups).forEach(function (key) {
    var members = groups[key];
    members.forEach(function (uid, i) {
      var a = 2 * Math.PI * i / members.length, d = members.length > 1 ? 9 : 0;
      offset[uid] = [d * Math.cos(a), d * Math.sin(a)];
    });
  });
  state.data.envs.forEach(function (env) {
    if (!visible(env)) return;
    shown++;
    var c = svg("circle", { cx: px(env) + offset[env.uid][0], cy: py(env) + offset[env.uid][1], r: r, fill: colourOf(env), "class": "pt" + (state.selected === env.uid ? " selected" : ""),
      "data-uid": env.uid, "stroke-width": 1 / state.zoom.k });
    c.addEventListener("mouseenter", function (ev) { showTooltip(env, ev); });
    c.addEventListener("mousemove", function (ev) { moveTooltip(ev); });
    c.addEventListener("mouseleave", hideTooltip);
    c.addEventListener("click", function (ev) { ev.stopPropagation(); select(env.uid); });
    g.appendChild(c);
  });
  $("shown").textContent = shown + " of " + state.data.envs.length + " environments shown";
  applyZoom();
  drawLegend();
}
function applyZoom() {
  var z = state.zoom;
  $("viewport").setAttribute("transform", "translate(" + z.x + "," + z.y + ") scale(" + z.k + ")");
  var r = 6 / Math.sqrt(z.k);
  Array.prototype.forEach.call(document.querySelectorAll("circle.pt"), function (c) {
    c.setAttribute("r", r); c.setAttribute("stroke-width", 1 / z.k);
  });
}
function svgPoint(ev) {
  var m = $("map"), p = m.createSVGPoint();
  p.x = ev.clientX; p.y = ev.clientY;
  return p.matrixTransform(m.getScreenCTM().inverse());
}
function setupZoom() {
  var m = $("map"), drag = null;
  m.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var p = svgPoint(ev), z = state.zoom, f = ev.deltaY < 0 ? 1.2 : 1 / 1.2;
    var k = Math.max(0.5, Math.min(40, z.k * f));
    z.x = p.x - (p.x - z.x) * (k / z.k); z.y = p.y - (p.y - z.y) * (k / z.k); z.k = k;
    applyZoom();
  }, { passive: false });
  m.addEventListener("mousedown", function (ev) { var p = svgPoint(ev); drag = { x: p.x, y: p.y, zx: state.zoom.x, zy: state.zoom.y, moved: false }; m.classList.add("dragging"); });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) return;
    var p = svgPoint(ev);
    state.zoom.x = drag.zx + (p.x - drag.x); state.zoom.y = drag.zy + (p.y - drag.y);
    drag.moved = true; applyZoom();
  });
  window.addEventListener("mouseup", function () { drag = null; m.classList.remove("dragging"); });
  $("zoom-reset").addEventListener("click", function () { state.zoom = { k: 1, x: 0, y: 0 }; applyZoom(); });
}
function showTooltip(env, ev) {
  var t = $("tooltip");
  t.innerHTML = "<b>" + esc(env.class_name || env.env_id) + "</b><br>" + esc(env.run) + " · step " + env.generated_step + " · slot " + env.slot +
    "<br>" + esc(env.skill) + "<br>win rate " + fmt(env.win_rate) + " · window win " + fmt(env.window_win) + " · regret " + fmt(env.regret) +
    (env.level == null ? "<br>" + fmt(env.lines, 0) + " lines · " + fmt(env.state_variables, 0) + " state vars"
                       : "<br>rlve level " + env.level + " · accuracy " + fmt(env.accuracy)) +
    " · reward levels " + fmt(env.reward_levels, 0);
  t.hidden = false; moveTooltip(ev);
}
function moveTooltip(ev) {
  var t = $("tooltip"), box = $("map-pane").getBoundingClientRect();
  var x = ev.clientX - box.left + 14, y = ev.clientY - box.top + 10;
  if (x + 320 > box.width) x = Math.max(0, ev.clientX - box.left - 330);
  t.style.left = x + "px"; t.style.top = y + "px";
}
function hideTooltip() { $("tooltip").hidden = true; }

/* ------------------------------------------------------------------ one environment */

var KEYWORDS = ("False None True and as assert async await break class continue def del elif else except finally for from global " +
  "if import in is lambda nonlocal not or pass raise return try while with yield match case").split(" ");
var BUILTINS = ("abs all any bool dict enumerate float int isinstance len list max min print range repr reversed round set sorted " +
  "str sum super tuple type zip map filter hasattr getattr setattr ValueError KeyError Exception").split(" ");
var TOKEN = /(#[^\n]*)|([rRbBfFuU]{0,2}(?:"""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))|(\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g;

function highlight(code) {
  var out = "", last = 0, prev = "", m;
  TOKEN.lastIndex = 0;
  while ((m = TOKEN.exec(code)) !== null) {
    out += esc(code.slice(last, m.index));
    if (m[1]) out += '<span class="com">' + esc(m[1]) + "</span>";
    else if (m[2]) out += '<span class="str">' + esc(m[2]) + "</span>";
    else if (m[3]) out += '<span class="num">' + esc(m[3]) + "</span>";
    else {
      var w = m[4];
      if (prev === "def" || prev === "class") out += '<span class="fn">' + esc(w) + "</span>";
      else if (KEYWORDS.indexOf(w) >= 0) out += '<span class="kw">' + w + "</span>";
      else if (w === "self") out += '<span class="self">self</span>';
      else if (BUILTINS.indexOf(w) >= 0) out += '<span class="bi">' + w + "</span>";
      else out += esc(w);
      prev = w;
    }
    if (!m[4]) prev = "";
    last = TOKEN.lastIndex;
  }
  return out + esc(code.slice(last));
}

function select(uid) {
  state.selected = uid;
  Array.prototype.forEach.call(document.querySelectorAll("circle.pt"), function (c) {
    c.classList.toggle("selected", c.getAttribute("data-uid") === uid);
  });
  var env = state.byUid[uid];
  if (!env) return;
  $("detail-title").textContent = (env.class_name || env.env_id) + " — " + env.run + ", step " + env.generated_step;
  $("detail-meta").innerHTML = esc(env.env_id) + " · " + esc(env.skill) + " · win rate " + fmt(env.win_rate) + " · regret " + fmt(env.regret) +
    " · learnable " + (env.learnable == null ? "–" : env.learnable ? "yes" : "no") + " · reward levels " + fmt(env.reward_levels, 0) +
    " (partial " + fmt(env.partial_levels, 0) + ") · " +
    (env.level == null ? fmt(env.lines, 0) + " lines · " + fmt(env.state_variables, 0) + " state vars"
                       : "rlve level " + env.level + " · accuracy " + fmt(env.accuracy)) + " · turns " + fmt(env.turns, 1) +
    (env.physics ? " · physics, formula stated: " + (env.formula_revealed == null ? "?" : env.formula_revealed ? "yes" : "no") : "") +
    (env.hint_contains_answer ? " · <b>hint contains a winning action</b>" : "");
  if (state.details[uid]) showDetail(uid);
  else {
    $("source").textContent = "loading…"; $("gutter").textContent = "";
    loadScript("details/" + env.detail + ".js");
  }
  showRejectedOfEnv(env);
}
window.spadeDetail = function (uid, detail) {
  state.details[uid] = detail;
  if (state.selected === uid) showDetail(uid);
};
function showDetail(uid) {
  var d = state.details[uid];
  var lines = d.source.split("\n").length;
  var nums = [];
  for (var i = 1; i <= lines; i++) nums.push(i);
  $("gutter").textContent = nums.join("\n");
  $("source").innerHTML = highlight(d.source);
  $("hint").textContent = d.hint || "(no hint)";
  $("document").textContent = d.document || "(no document)";
  showEpisodes();
}
function showEpisodes() {
  var d = state.details[state.selected], box = $("episodes");
  if (!d) { box.innerHTML = ""; return; }
  var eps = d.episodes.filter(function (e) { return e.arm === state.arm; });
  var returns = state.arm === "hint" ? d.hint_returns : d.nohint_returns;
  var summary = Object.keys(returns).map(function (s) { return "step " + s + ": " + returns[s].map(function (r) { return fmt(r); }).join(" "); }).join(" · ");
  var html = '<div class="muted">all returns of this arm: ' + (summary ? esc(summary) : "none kept") + "</div>";
  if (!eps.length) html += '<p class="muted">no trajectories kept for this arm</p>';
  eps.forEach(function (e, n) {
    html += '<div class="episode' + (e["return"] > 0 ? " won" : "") + '"><div class="head">step ' + e.step + " · play " + e.index + " · seed " + esc(e.seed) +
      " · return " + fmt(e["return"]) + " · " + esc(e.end_reason) + " · " + e.turns.length + " turns</div><div class=\"body\">" +
      '<pre class="opening">' + esc(e.opening) + '</pre><table class="turns"><tr><th>#</th><th>action</th><th>observation</th><th>reward</th></tr>';
    e.turns.forEach(function (t, i) {
      html += "<tr><td>" + (i + 1) + "</td><td><pre>" + esc(t.action) + "</pre></td><td><pre>" + esc(t.observation) + '</pre></td><td class="r">' + fmt(t.reward) +
        (t.terminated ? " ■" : "") + (t.truncated ? " ✂" : "") + "</td></tr>";
    });
    html += "</table></div></div>";
  });
  box.innerHTML = html;
}
function rejectedHtml(list) {
  if (!list || !list.length) return '<p class="muted">no rejected candidates</p>';
  return list.map(function (r) {
    return '<div class="rej">slot ' + r.slot + " · attempt " + r.attempt + " · " + esc(r.skill) + ' · <span class="why">' + esc(r.stage) + ": " + esc(r.kind) + "</span>" +
      "<br>" + esc(r.message) + "<details><summary>designer response</summary><pre>" + esc(r.response) + "</pre></details></div>";
  }).join("");
}
function runOf(name) { return state.data.runs.filter(function (r) { return r.name === name; })[0]; }
function showRejectedOfEnv(env) {
  var run = runOf(env.run), list = run ? run.rejected[String(env.generated_step)] : null;
  $("rejected-env").innerHTML = "<p>rejected candidates of " + esc(env.run) + ", step " + env.generated_step + ":</p>" + rejectedHtml(list);
}
function setupTabs() {
  Array.prototype.forEach.call(document.querySelectorAll("#tabs button"), function (b) {
    b.addEventListener("click", function () {
      state.tab = b.getAttribute("data-tab");
      Array.prototype.forEach.call(document.querySelectorAll("#tabs button"), function (o) { o.classList.toggle("active", o === b); });
      Array.prototype.forEach.call(document.querySelectorAll(".tab"), function (t) { t.hidden = t.id !== "tab-" + state.tab; });
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll("#arms button"), function (b) {
    b.addEventListener("click", function () {
      state.arm = b.getAttribute("data-arm");
      Array.prototype.forEach.call(document.querySelectorAll("#arms button"), function (o) { o.classList.toggle("active", o === b); });
      showEpisodes();
    });
  });
}

/* ------------------------------------------------------------------ curves and rejected per step */

function curveSeries(key) {
  return state.data.runs.map(function (run) {
    var pts = (run.curves[key] || run.metrics[key] || []).filter(function (p) { return p[1] !== null && p[1] !== undefined; });
    return { name: run.name, pts: pts };
  });
}
function drawCurve() {
  var key = $("curve-key").value, box = $("curve");
  while (box.firstChild) box.removeChild(box.firstChild);
  if (!key) return;
  var series = curveSeries(key), all = [];
  series.forEach(function (s) { all = all.concat(s.pts); });
  var W = 640, H = 260, L = 48, R = 150, T = 12, B = 28;
  box.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, "class": "axis" }));
  box.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, "class": "axis" }));
  if (!all.length) {
    var t = svg("text", { x: L + 10, y: H / 2 }); t.textContent = "no values yet"; box.appendChild(t); return;
  }
  var xs = all.map(function (p) { return p[0]; }), ys = all.map(function (p) { return p[1]; });
  var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  function sx(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
  function sy(v) { return H - B - (v - y0) / (y1 - y0) * (H - T - B); }
  [0, 0.5, 1].forEach(function (f) {
    var v = y0 + f * (y1 - y0), t = svg("text", { x: 4, y: sy(v) + 3 }); t.textContent = fmt(v); box.appendChild(t);
    var u = x0 + f * (x1 - x0), s = svg("text", { x: sx(u) - 8, y: H - 10 }); s.textContent = String(Math.round(u)); box.appendChild(s);
  });
  var xl = svg("text", { x: (W - R) / 2, y: H - 1 }); xl.textContent = "step"; box.appendChild(xl);
  series.forEach(function (s, i) {
    var colour = PALETTE[i % PALETTE.length];
    if (s.pts.length) {
      box.appendChild(svg("polyline", { points: s.pts.map(function (p) { return sx(p[0]) + "," + sy(p[1]); }).join(" "), fill: "none", stroke: colour, "stroke-width": 2, "class": "series" }));
      s.pts.forEach(function (p) { var c = svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: colour }); var tt = svg("title"); tt.textContent = s.name + " step " + p[0] + ": " + fmt(p[1], 3); c.appendChild(tt); box.appendChild(c); });
    }
    var lt = svg("text", { x: W - R + 10, y: T + 12 + 14 * i, fill: colour }); lt.textContent = s.name; box.appendChild(lt);
  });
}
function fillCurveKeys() {
  var keys = {}, d = state.data;
  d.runs.forEach(function (r) { Object.keys(r.curves).forEach(function (k) { if (r.curves[k].length) keys[k] = "analysis"; }); });
  var analysisKeys = Object.keys(keys);
  var metricKeys = {};
  d.runs.forEach(function (r) { Object.keys(r.metrics).forEach(function (k) { metricKeys[k] = 1; }); });
  var select = $("curve-key"), old = select.value;
  select.innerHTML = "";
  function group(label, list) {
    if (!list.length) return;
    var g = document.createElement("optgroup"); g.label = label;
    list.forEach(function (k) { var o = document.createElement("option"); o.value = k; o.textContent = k; g.appendChild(o); });
    select.appendChild(g);
  }
  group("analysis (per regeneration step)", analysisKeys);
  group("metrics.jsonl (per step)", Object.keys(metricKeys).sort());
  if (old && (keys[old] || metricKeys[old])) select.value = old;
  else if (keys.vendi_per_n) select.value = "vendi_per_n";
}
function fillRejected() {
  var d = state.data;
  fillSelect($("rej-run"), d.runs.map(function (r) { return r.name; }), false);
  var run = runOf($("rej-run").value) || d.runs[0];
  var steps = run ? run.regeneration_steps.map(String) : [];
  fillSelect($("rej-step"), steps, false);
  drawRejected();
}
function drawRejected() {
  var run = runOf($("rej-run").value);
  $("rejected-list").innerHTML = run ? rejectedHtml(run.rejected[$("rej-step").value]) : "";
}

/* ------------------------------------------------------------------ data */

window.spadeData = function (data) {
  if (state.data && state.data.build === data.build) {
    setStatus("data of " + data.built_at + " (unchanged)");
    return;  // nothing new: keep the page as it is (scroll, open episodes)
  }
  state.data = data;
  state.byUid = {};
  data.envs.forEach(function (e) { state.byUid[e.uid] = e; });
  var runs = data.runs.map(function (r) { return r.name; });
  fillSelect($("f-run"), runs, true);
  fillSelect($("f-skill"), skillList(), true);
  var regenerations = data.runs.reduce(function (n, r) { return n + r.regeneration_steps.length; }, 0);
  $("summary").textContent = runs.length + " run" + (runs.length === 1 ? "" : "s") + " · " + data.envs.length + " environments · " +
    regenerations + " regeneration steps · map: " + (data.map || ("t-SNE of " + data.embedding + " embeddings")) +
    data.runs.map(function (r) {
      var names = Object.keys(r.not_applicable || {});
      return names.length ? " · " + r.name + " (env_source " + r.env_source + "): not applicable: " + names.join(", ").replace(/_/g, " ") : "";
    }).join("");
  setStatus("data of " + data.built_at);
  fillCurveKeys();
  fillRejected();
  drawMap();
  drawCurve();
  if (state.selected && state.byUid[state.selected]) {
    delete state.details[state.selected];  // re-read: a run in progress keeps adding plays
    select(state.selected);
  }
};
function reload() {
  setStatus("reloading…");
  loadScript("data.js?t=" + Date.now());
}

function init() {
  setupZoom();
  setupTabs();
  ["colour", "f-run", "f-skill", "f-min", "f-max", "f-text"].forEach(function (id) {
    $(id).addEventListener("input", drawMap);
    $(id).addEventListener("change", drawMap);
  });
  $("curve-key").addEventListener("change", drawCurve);
  $("rej-run").addEventListener("change", fillRejected);
  $("rej-step").addEventListener("change", drawRejected);
  $("reload").addEventListener("click", reload);
  $("auto").checked = location.protocol.indexOf("http") === 0;
  state.reloadTimer = setInterval(function () { if ($("auto").checked) reload(); }, 10000);
}
init();
