// The schedule explorer: draws the simulator's timelines for the settings the reader picks, one schedule or two
// side by side on one time axis. Every number comes from the packs that docs/explorer.py exports from the
// simulator when the site is built (window.EXPLORER: the axes, the key orders, labels, closed forms' texts;
// window.EXPLORER_PACKS[name]: one schedule's runs, gzipped JSON in base64, loaded from the same folder when the
// reader first picks that schedule). This script builds a run's key from the controls, looks it up, undoes the
// pack's deltas and draws it: no schedule logic here, and the closed forms arrive computed. Loads nothing from
// elsewhere.
(function () {
  "use strict";
  var data = window.EXPLORER;
  var root = document.getElementById("explorer");
  if (!data || !root) { return; }
  var base = document.querySelector("script[src$='explorer-data.js']").getAttribute("src").replace(/explorer-data\.js$/, "");
  var COLOURS = { F: "#4c72b0", B: "#dd8452", R: "#55a868", W: "#c44e52", C: "#8c8c8c" };
  var NAMES = { F: "forward", B: "backward", R: "recompute", W: "weight grad", C: "copy" };
  // One colour per device up to eight (the grid's most devices), seaborn's "deep" palette without its grey
  var LINES = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#ccb974"];
  // A device's share of the model computes its forward in 1 ms (Note [units] in docs/explorer.py): every time,
  // tick and text is in ms
  var UNIT = "ms";
  var SVG = "http://www.w3.org/2000/svg";
  var WIDTH = 760, LEFT = 50, ROW = 26, HEIGHT = 120, AXIS = 34;  // AXIS: the time axis's ticks and label
  var controls = document.getElementById("explorer-controls");
  var inputs = {}, shown = {}, sliders = {}, packs = {}, drawing = 0;

  function control(name, values, label, start) {  // a slider over numeric values (its value an index), else a select
    var wrap = document.createElement("label"), input;
    wrap.style.display = "inline-block";
    wrap.style.margin = "0 1.5em 0.4em 0";
    wrap.textContent = label + " ";
    sliders[name] = values.every(function (x) { return !isNaN(Number(x)); });
    if (sliders[name]) {
      input = document.createElement("input");
      input.type = "range";
      input.min = "0";
      input.max = String(values.length - 1);
      input.step = "1";
      input.value = String(Math.max(values.indexOf(start), 0));
      input.addEventListener("input", draw);
      shown[name] = document.createElement("output");
      shown[name].id = "explorer-" + name + "-value";
      shown[name].style.display = "inline-block";
      shown[name].style.minWidth = "2.5em";
    } else {
      input = document.createElement("select");
      values.forEach(function (x) {
        var option = document.createElement("option");
        option.value = option.textContent = x;
        input.appendChild(option);
      });
      input.value = start;
    }
    input.id = "explorer-" + name;
    input.addEventListener("change", draw);
    wrap.appendChild(input);
    if (shown[name]) { wrap.appendChild(shown[name]); }
    controls.appendChild(wrap);
    inputs[name] = input;
  }

  Object.keys(data.axes).forEach(function (name) {
    control(name, data.axes[name], data.labels[name], data.start[name]);
    if (name === "schedule") {  // the second schedule, drawn below the first on the same time axis
      control("compare", ["none"].concat(data.axes.schedule), "beside it", "none");
    }
  });

  function value(name) {  // the setting as docs/explorer.py wrote it in its keys
    return sliders[name] ? data.axes[name][Number(inputs[name].value)] : inputs[name].value;
  }

  function inflate(text) {  // base64 of gzip -> the pack's JSON
    var bin = atob(text), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).json();
  }

  function load(name) {  // a promise of the schedule's pack, loaded and inflated once
    if (!packs[name]) {
      packs[name] = new Promise(function (resolve, reject) {
        var script = document.createElement("script");
        script.src = base + data.schedules[name].pack;
        script.onload = function () { inflate(window.EXPLORER_PACKS[name]).then(resolve, reject); };
        script.onerror = reject;
        document.head.appendChild(script);
      });
    }
    return packs[name];
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

  function fmt(ticks) { return String(Math.round(ticks / data.ticks * 1000) / 1000) + " " + UNIT; }
  function full(units) { return (units / data.saved).toFixed(2); }
  function percent(b) { return (100 * b).toFixed(1) + "%"; }

  function lookup(name, pack) {  // {shape, run, key} for the controls (Note [run keys] in docs/explorer.py)
    var at = data.shape.map(value).join("|"), shape = pack.shapes[at];
    if (typeof shape === "string") { return { refused: shape }; }
    var key = [at].concat(data.costs.map(function (c) {
      return c === data.split && !shape.split ? "-" : value(c);
    })).join("|");
    return { shape: shape, key: key, run: pack.runs[key] };
  }

  function draw() {
    Object.keys(shown).forEach(function (name) { shown[name].textContent = " " + value(name); });
    var names = [value("schedule")], mine = ++drawing;
    if (value("compare") !== "none") { names.push(value("compare")); }
    Promise.all(names.map(load)).then(function (loaded) {
      if (mine === drawing) { render(names, loaded); }  // else the reader moved on while a pack loaded
    });
  }

  function render(names, loaded) {
    var found = names.map(function (name, i) { return lookup(name, loaded[i]); });
    var runs = found.filter(function (f) { return f.run; }).map(function (f) { return f.run; });
    var longest = Math.max.apply(null, runs.map(function (r) { return r.t; }).concat([1]));
    var peak = Math.max.apply(null, runs.map(function (r) { return Math.max.apply(null, r.k); }).concat([1]));
    var scale = (WIDTH - LEFT - 10) / longest;  // one time axis for both
    inputs.weight.disabled = !found.some(function (f) { return f.shape && f.shape.split; });
    ["", "-2"].forEach(function (suffix, i) {
      var panel = document.getElementById("explorer-panel" + suffix);
      panel.style.display = i < names.length ? "" : "none";
      panel.setAttribute("data-scale", String(scale));
      var parts = ["gantt", "memory", "summary", "form", "note"].reduce(function (out, part) {
        out[part] = document.getElementById("explorer-" + part + suffix);
        clear(out[part]);
        return out;
      }, {});
      if (i >= names.length) { parts.gantt.setAttribute("data-key", "none"); return; }
      panelFor(names[i], found[i], parts, scale, peak);
    });
  }

  function panelFor(name, f, parts, scale, peak) {
    var kind = data.schedules[name];
    if (f.refused) {
      parts.summary.textContent = name + " refused: " + f.refused;
      parts.note.textContent = name + " needs: " + kind.constraints;
      parts.gantt.setAttribute("data-key", "refused");
      return;
    }
    if (!f.run) {
      parts.summary.textContent = name + " not simulated here: " + kind.unsimulated;
      parts.gantt.setAttribute("data-key", "unsimulated");
      return;
    }
    var run = f.run, shape = f.shape;
    parts.note.textContent = name + ": " + (shape.split ? "B and W split the backward. " :
      "runs the backward whole (no W), so W's share does not apply. ") + kind.description.replace(/\.?$/, ".");
    parts.gantt.setAttribute("data-key", name + "|" + f.key);
    gantt(parts.gantt, shape.orders[run.o || 0], run, scale);
    memory(parts.memory, run, scale, peak);
    var text = name + ": makespan " + fmt(run.t) + ", bubble " + percent(run.b) + ", " + shape.stages +
      " stages; peak memory per device " + run.k.map(full).join(", ") + " full activations";
    if (run.l !== undefined) {
      text += "; the search's lower bound " + fmt(run.l) + " (" + run.h + "), within " +
        shape.limit.toFixed(2) + " full activations per device";
    }
    parts.summary.textContent = text;
    parts.form.textContent = closed(name, run, kind.form);
  }

  function closed(name, run, form) {  // the closed form exported beside the run, and why they differ
    if (!run.f) {
      return run.l !== undefined ? "No closed form for a searched schedule: its lower bound stands in." :
        "No closed form for " + name + " here.";
    }
    var f = run.f, differ = [];
    if (f.t !== run.t) { differ.push("makespan"); }
    if (Math.abs(f.b - run.b) > 5e-4) { differ.push("bubble"); }
    if (f.k.join() !== run.k.join()) { differ.push("memory"); }
    var text = "Closed form " + form.makespan + " (memory: " + form.memory + "): makespan " + fmt(f.t) +
      ", bubble " + percent(f.b) + ", peak " + f.k.map(full).join(", ") + ". ";
    if (!differ.length) { return text + "Equal to the simulation."; }
    var why = run.x.map(function (code) {
      return data.reasons[code] + (code === "range" ? " (" + form.range + ")" : code === "costs" ? " (" + form.costs + ")" : "");
    });
    var what = differ.length > 1 ? differ.slice(0, -1).join(", ") + " and " + differ[differ.length - 1] : differ[0];
    return text + "The " + what + " differ" + (differ.length > 1 ? "" : "s") + " from the simulation: " +
      (why.length ? why.join("; ") : "no assumption of the form is broken here") + ".";
  }

  function gantt(svg, order, run, scale) {
    var p = run.k.length, rows = 2 * p, seen = {};  // a compute and a copy row per device
    svg.setAttribute("viewBox", "0 0 " + WIDTH + " " + (rows * ROW + AXIS + 30));
    // half: 0 a whole row; 1 and 2 the upper and lower half, for the first and second task of an overlapped pair
    // (two tasks of one device starting together: DualPipe-V's pairs), as docs/figures/beyond_1f1b.py draws them
    function bar(d, task, start, end, copy, half) {
      var op = copy ? "C" : task[0], y = (2 * d + (copy ? 1 : 0)) * ROW, tall = copy ? ROW - 12 : ROW - 4;
      seen[op] = true;
      var r = el("rect", { x: LEFT + start * scale, y: y + (copy ? 6 : 2) + (half === 2 ? tall / 2 : 0),
                           width: Math.max((end - start) * scale, 0.5), height: half ? tall / 2 : tall,
                           fill: COLOURS[op], stroke: "white", "stroke-width": 0.5,
                           "class": half ? "span paired" : "span" }, svg);
      var parts = task.slice(1).split("@");
      el("title", {}, r).textContent = (copy ? "copy of the result of " + NAMES[task[0]] : NAMES[op]) +
        " of micro-batch " + parts[0] + " on stage " + parts[1] + ", " + fmt(start) + " to " + fmt(end);
    }
    for (var d = 0; d < p; d++) {
      el("text", { x: 4, y: 2 * d * ROW + ROW * 0.65, "font-size": 11 }, svg).textContent = "dev " + d;
      var tasks = order.tasks[d].split(" "), times = sums(run.s[d]);
      tasks.forEach(function (task, i) {
        var half = times[2 * i] === times[2 * i + 2] ? 1 : i > 0 && times[2 * i] === times[2 * i - 2] ? 2 : 0;
        bar(d, task, times[2 * i], times[2 * i + 1], false, half);
      });
      if (run.c[d].length) {
        var copies = order.copies[d].split(" "), ctimes = sums(run.c[d]);
        copies.forEach(function (task, i) { bar(d, task, ctimes[2 * i], ctimes[2 * i + 1], true, 0); });
      }
    }
    axis(svg, rows * ROW + 2, scale);
    legend(svg, rows * ROW + AXIS + 4, 110, Object.keys(COLOURS).filter(function (k) { return seen[k]; })
      .map(function (k) { return [COLOURS[k], NAMES[k]]; }));
  }

  function legend(svg, y, width, entries) {  // [colour, text] swatches in a row, each ``width`` wide
    entries.forEach(function (entry, i) {
      el("rect", { x: LEFT + width * i, y: y, width: 12, height: 12, fill: entry[0], "class": "legend" }, svg);
      el("text", { x: LEFT + width * i + 16, y: y + 10, "font-size": 11 }, svg).textContent = entry[1];
    });
  }

  function axis(svg, y, scale) {  // ticks in ms, a round step that gives at most about ten of them, and its label
    var span = (WIDTH - LEFT - 10) / scale / data.ticks, step = 1, k = 0;
    while (span / step > 10) { k++; step = [1, 2, 5][k % 3] * Math.pow(10, Math.floor(k / 3)); }
    for (var t = 0; t <= span + 1e-9; t += step) {
      var x = LEFT + t * data.ticks * scale;
      el("line", { x1: x, x2: x, y1: y, y2: y + 4, stroke: "#888" }, svg);
      el("text", { x: x - 4, y: y + 15, "font-size": 10, "class": "tick" }, svg).textContent =
        String(Math.round(t * 100) / 100);
    }
    el("text", { x: WIDTH - 10, y: y + 28, "font-size": 11, "text-anchor": "end", "class": "axis-label" }, svg)
      .textContent = "time (" + UNIT + ")";
  }

  function memory(svg, run, scale, peak) {
    svg.setAttribute("viewBox", "0 0 " + WIDTH + " " + (HEIGHT + AXIS + 42));
    run.y.forEach(function (series, dev) {
      var points = [], last = 0, times = sums(series[0]);
      function at(t, v) { return (LEFT + t * scale) + "," + (HEIGHT - v / peak * (HEIGHT - 10)); }
      times.forEach(function (t, i) {
        points.push(at(t, last));
        last = series[1][i];
        points.push(at(t, last));
      });
      points.push(at(run.t, last));
      el("polyline", { points: points.join(" "), fill: "none", stroke: LINES[dev % LINES.length],
                       "stroke-width": 1.5, "class": "memory" }, svg);
    });
    axis(svg, HEIGHT + 2, scale);
    legend(svg, HEIGHT + AXIS + 4, 70, run.y.map(function (_, dev) { return [LINES[dev % LINES.length], "dev " + dev]; }));
    el("text", { x: 4, y: HEIGHT + AXIS + 34, "font-size": 11 }, svg).textContent =
      "memory saved for backward per device (top: " + full(peak) + " full activations)";
  }

  draw();
}());
