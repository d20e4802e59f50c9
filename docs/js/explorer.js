// The schedule explorer: draws the simulator's timeline for the settings the reader picks.
// Every number comes from window.EXPLORER, which docs/explorer.py exports from the simulator when the site is
// built; this script only looks a run up and draws it (no schedule logic here). Loads nothing from elsewhere.
(function () {
  "use strict";
  var data = window.EXPLORER;
  var root = document.getElementById("explorer");
  if (!data || !root) { return; }
  var COLOURS = { F: "#4c72b0", B: "#dd8452", R: "#55a868", W: "#c44e52", C: "#8c8c8c" };
  var NAMES = { F: "forward", B: "backward", R: "recompute", W: "weight grad", C: "copy" };
  var LABELS = { schedule: "schedule", p: "devices p", m: "micro-batches m", backward: "backward / forward",
                 copy: "copy / forward", checkpoint: "checkpoint" };
  var SVG = "http://www.w3.org/2000/svg";
  var controls = document.getElementById("explorer-controls");
  var selects = {};

  Object.keys(data.axes).forEach(function (name) {
    var label = document.createElement("label");
    label.textContent = LABELS[name] + " ";
    var select = document.createElement("select");
    select.id = "explorer-" + name;
    data.axes[name].forEach(function (value) {
      var option = document.createElement("option");
      option.value = String(value);
      option.textContent = String(value);
      select.appendChild(option);
    });
    if (name === "m") { select.value = "8"; }
    if (name === "p") { select.value = "4"; }
    if (name === "backward") { select.value = "2.0"; }
    select.addEventListener("change", draw);
    label.appendChild(select);
    controls.appendChild(label);
    selects[name] = select;
  });

  function keyOf() {  // the values as docs/explorer.py wrote them, joined as its key()
    return Object.keys(data.axes).map(function (name) { return selects[name].value; }).join("|");
  }

  function el(tag, attrs, parent) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(node); }
    return node;
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  function draw() {
    var run = data.runs[keyOf()];
    var gantt = document.getElementById("explorer-gantt");
    var memory = document.getElementById("explorer-memory");
    var summary = document.getElementById("explorer-summary");
    clear(gantt);
    clear(memory);
    if (!run) {
      summary.textContent = "This schedule does not take these settings (see its constraints on Beyond 1F1B).";
      gantt.setAttribute("data-key", "none");
      return;
    }
    var p = run.peak.length, width = 760, left = 50, row = 26, scale = (width - left - 10) / run.makespan;
    var rows = 2 * p;  // compute and copy row per device
    gantt.setAttribute("viewBox", "0 0 " + width + " " + (rows * row + 30));
    gantt.setAttribute("data-key", keyOf());
    for (var d = 0; d < p; d++) {
      var t = el("text", { x: 4, y: 2 * d * row + row * 0.65, "font-size": 11 }, gantt);
      t.textContent = "dev " + d;
    }
    var seen = {};
    run.spans.forEach(function (s) {
      var copy = s[1] === "C", y = (2 * s[0] + (copy ? 1 : 0)) * row;
      seen[s[1]] = true;
      var r = el("rect", { x: left + s[3] * scale, y: y + (copy ? 6 : 2), width: Math.max((s[4] - s[3]) * scale, 0.5),
                           height: copy ? row - 12 : row - 4, fill: COLOURS[s[1]], stroke: "white",
                           "stroke-width": 0.5, "class": "span" }, gantt);
      var title = el("title", {}, r);
      title.textContent = NAMES[s[1]] + " of micro-batch " + s[2] + ", " + s[3] + " to " + s[4];
    });
    var x = left;
    Object.keys(COLOURS).forEach(function (k) {
      if (!seen[k]) { return; }
      el("rect", { x: x, y: rows * row + 12, width: 12, height: 12, fill: COLOURS[k] }, gantt);
      var label = el("text", { x: x + 16, y: rows * row + 22, "font-size": 11 }, gantt);
      label.textContent = NAMES[k];
      x += 110;
    });
    var peak = Math.max.apply(null, run.peak);
    summary.textContent = "makespan " + run.makespan + " forwards, bubble " + (100 * run.bubble).toFixed(1) +
      "%, " + run.stages + " stages; peak memory per device " + run.peak.map(function (b) {
        return (b / data.saved).toFixed(2);
      }).join(", ") + " full activations";
    var height = 160;
    memory.setAttribute("viewBox", "0 0 " + width + " " + (height + 20));
    run.memory.forEach(function (series, dev) {
      var points = [], last = 0;
      series.forEach(function (pt) {
        points.push((left + pt[0] * scale) + "," + (height - last / peak * (height - 10)));
        last = pt[1];
        points.push((left + pt[0] * scale) + "," + (height - last / peak * (height - 10)));
      });
      points.push((left + run.makespan * scale) + "," + (height - last / peak * (height - 10)));
      el("polyline", { points: points.join(" "), fill: "none", stroke: ["#4c72b0", "#dd8452", "#55a868", "#c44e52"][dev % 4],
                       "stroke-width": 1.5, "class": "memory" }, memory);
    });
    var axis = el("text", { x: 4, y: height + 15, "font-size": 11 }, memory);
    axis.textContent = "memory saved for backward per device (top: " + (peak / data.saved).toFixed(2) +
      " full activations)";
  }

  draw();
}());
