// The schedule explorer: draws the simulator's timeline for the settings the reader picks.
// Every number comes from the packs that docs/explorer.py exports from the simulator when the site is built
// (window.EXPLORER: the axes; window.EXPLORER_PACKS[name]: one schedule's runs, gzipped JSON in base64, loaded
// from the same folder when the reader first picks that schedule). This script looks a run up, undoes the pack's
// deltas and draws it: no schedule logic here. Loads nothing from elsewhere.
(function () {
  "use strict";
  var data = window.EXPLORER;
  var root = document.getElementById("explorer");
  if (!data || !root) { return; }
  var base = document.querySelector("script[src$='explorer-data.js']").getAttribute("src").replace(/explorer-data\.js$/, "");
  var COLOURS = { F: "#4c72b0", B: "#dd8452", R: "#55a868", W: "#c44e52", C: "#8c8c8c" };
  var NAMES = { F: "forward", B: "backward", R: "recompute", W: "weight grad", C: "copy" };
  var LABELS = { schedule: "schedule", p: "devices p", v: "stages per device v", m: "micro-batches m",
                 checkpoint: "checkpoint", backward: "backward / forward", weight: "W's share of the backward",
                 copy: "copy / forward" };
  var START = { schedule: "gpipe", p: "4", v: "1", m: "8", checkpoint: "never", backward: "2.0", weight: "0.5",
                copy: "0.0" };
  var SLIDERS = { p: true, v: true, m: true, backward: true, weight: true, copy: true };
  var SVG = "http://www.w3.org/2000/svg";
  var controls = document.getElementById("explorer-controls");
  var inputs = {}, shown = {}, packs = {}, waiting = {};

  Object.keys(data.axes).forEach(function (name) {
    var label = document.createElement("label"), values = data.axes[name], input;
    label.style.display = "inline-block";
    label.style.margin = "0 1.5em 0.4em 0";
    label.textContent = LABELS[name] + " ";
    if (SLIDERS[name]) {  // a slider over the grid's values; its value is the index of one
      input = document.createElement("input");
      input.type = "range";
      input.min = "0";
      input.max = String(values.length - 1);
      input.step = "1";
      input.value = String(Math.max(values.indexOf(START[name]), 0));
      input.addEventListener("input", draw);
      shown[name] = document.createElement("output");
      shown[name].id = "explorer-" + name + "-value";
      shown[name].style.display = "inline-block";
      shown[name].style.minWidth = "2.5em";
    } else {
      input = document.createElement("select");
      values.forEach(function (value) {
        var option = document.createElement("option");
        option.value = option.textContent = value;
        input.appendChild(option);
      });
      input.value = START[name];
    }
    input.id = "explorer-" + name;
    input.addEventListener("change", draw);
    label.appendChild(input);
    if (shown[name]) { label.appendChild(shown[name]); }
    controls.appendChild(label);
    inputs[name] = input;
  });

  function value(name) {  // the setting as docs/explorer.py wrote it in its keys
    var input = inputs[name];
    return SLIDERS[name] ? data.axes[name][Number(input.value)] : input.value;
  }

  function inflate(text) {  // base64 of gzip -> the pack's JSON
    var bin = atob(text), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).json();
  }

  function withPack(name, then) {  // call then(pack) once the schedule's pack is loaded and inflated
    if (packs[name]) { then(packs[name]); return; }
    if (waiting[name]) { waiting[name] = then; return; }
    waiting[name] = then;
    var script = document.createElement("script");
    script.src = base + data.schedules[name].pack;
    script.onload = function () {
      inflate(window.EXPLORER_PACKS[name]).then(function (pack) {
        packs[name] = pack;
        var latest = waiting[name];
        delete waiting[name];
        latest(pack);
      });
    };
    document.head.appendChild(script);
  }

  function el(tag, attrs, parent) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(node); }
    return node;
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  function sums(deltas) {  // the pack stores each list of ticks as deltas
    var out = [], t = 0;
    deltas.forEach(function (d) { t += d; out.push(t); });
    return out;
  }

  function fmt(ticks) { return String(Math.round(ticks / data.ticks * 1000) / 1000); }

  function draw() {
    Object.keys(shown).forEach(function (name) { shown[name].textContent = " " + value(name); });
    var name = value("schedule");
    withPack(name, function (pack) { render(name, pack); });
  }

  function render(name, pack) {
    if (name !== value("schedule")) { return; }  // the reader moved on while this pack loaded
    var at = ["p", "v", "m", "checkpoint"].map(value).join("|");
    var shape = pack.shapes[at];
    var gantt = document.getElementById("explorer-gantt");
    var memory = document.getElementById("explorer-memory");
    var summary = document.getElementById("explorer-summary");
    var note = document.getElementById("explorer-note");
    clear(gantt);
    clear(memory);
    if (typeof shape === "string") {
      summary.textContent = "Refused: " + shape;
      note.textContent = name + " needs: " + data.schedules[name].constraints;
      gantt.setAttribute("data-key", "refused");
      inputs.weight.disabled = false;
      return;
    }
    var key = at + "|" + value("backward") + "|" + (shape.split ? value("weight") : "-") + "|" + value("copy");
    var run = pack.runs[key];
    inputs.weight.disabled = !shape.split;
    note.textContent = (shape.split ? "B and W split the backward. " :
      "This schedule runs the backward whole (no W), so W's share does not apply. ") + data.schedules[name].description;
    var p = run.k.length, width = 760, left = 50, row = 26, scale = (width - left - 10) / run.t;
    var rows = 2 * p;  // compute and copy row per device
    gantt.setAttribute("viewBox", "0 0 " + width + " " + (rows * row + 30));
    gantt.setAttribute("data-key", name + "|" + key);
    var seen = {};
    function bar(d, task, start, end, copy) {
      var op = copy ? "C" : task[0], y = (2 * d + (copy ? 1 : 0)) * row;
      seen[op] = true;
      var r = el("rect", { x: left + start * scale, y: y + (copy ? 6 : 2), width: Math.max((end - start) * scale, 0.5),
                           height: copy ? row - 12 : row - 4, fill: COLOURS[op], stroke: "white",
                           "stroke-width": 0.5, "class": "span" }, gantt);
      var parts = task.slice(1).split("@");
      el("title", {}, r).textContent = (copy ? "copy of the result of " + NAMES[task[0]] : NAMES[op]) +
        " of micro-batch " + parts[0] + " on stage " + parts[1] + ", " + fmt(start) + " to " + fmt(end);
    }
    for (var d = 0; d < p; d++) {
      el("text", { x: 4, y: 2 * d * row + row * 0.65, "font-size": 11 }, gantt).textContent = "dev " + d;
      var tasks = shape.tasks[d].split(" "), times = sums(run.s[d]);
      tasks.forEach(function (task, i) { bar(d, task, times[2 * i], times[2 * i + 1], false); });
      if (run.c[d].length) {
        var copies = shape.copies[d].split(" "), ctimes = sums(run.c[d]);
        copies.forEach(function (task, i) { bar(d, task, ctimes[2 * i], ctimes[2 * i + 1], true); });
      }
    }
    var x = left;
    Object.keys(COLOURS).forEach(function (k) {
      if (!seen[k]) { return; }
      el("rect", { x: x, y: rows * row + 12, width: 12, height: 12, fill: COLOURS[k] }, gantt);
      el("text", { x: x + 16, y: rows * row + 22, "font-size": 11 }, gantt).textContent = NAMES[k];
      x += 110;
    });
    var peak = Math.max.apply(null, run.k);
    summary.textContent = "makespan " + fmt(run.t) + " forwards, bubble " + (100 * run.b).toFixed(1) + "%, " +
      shape.stages + " stages; peak memory per device " + run.k.map(function (b) {
        return (b / data.saved).toFixed(2);
      }).join(", ") + " full activations";
    var height = 160;
    memory.setAttribute("viewBox", "0 0 " + width + " " + (height + 20));
    run.y.forEach(function (series, dev) {
      var points = [], last = 0, times = sums(series[0]);
      function at(t, v) { return (left + t * scale) + "," + (height - v / peak * (height - 10)); }
      times.forEach(function (t, i) {
        points.push(at(t, last));
        last = series[1][i];
        points.push(at(t, last));
      });
      points.push(at(run.t, last));
      el("polyline", { points: points.join(" "), fill: "none", stroke: ["#4c72b0", "#dd8452", "#55a868", "#c44e52"][dev % 4],
                       "stroke-width": 1.5, "class": "memory" }, memory);
    });
    el("text", { x: 4, y: height + 15, "font-size": 11 }, memory).textContent =
      "memory saved for backward per device (top: " + (peak / data.saved).toFixed(2) + " full activations)";
  }

  draw();
}());
