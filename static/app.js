/* isplan dashboard behaviour. No inline scripts: figures come from data-figure attributes and
   every handler is attached here, so the page runs under a strict Content-Security-Policy. */
(function () {
  "use strict";

  function form() { return document.getElementById("controls"); }

  function renderFigures(root) {
    if (!window.Plotly) return;
    (root || document).querySelectorAll(".plotly-figure[data-figure]").forEach(function (el) {
      try {
        var fig = JSON.parse(el.getAttribute("data-figure"));
        window.Plotly.react(el, fig.data, fig.layout, {displaylogo: false, responsive: true});
      } catch (e) { el.textContent = "figure unavailable: " + e; }
    });
  }

  function mapInfo() {
    var map = document.getElementById("layer-map");
    if (!map) return null;
    var full = map.dataset.full ? map.dataset.full.split(",").map(Number) : [];
    var starts = map.dataset.starts ? map.dataset.starts.split(",").map(Number) : [];
    return {map: map, n: Number(map.dataset.numLayers), full: full, starts: starts};
  }

  /* Set stage k's first layer (k >= 1, 0-based stage index) and ask the server for the new plan. */
  function moveBoundary(stageIndex, layer) {
    var info = mapInfo();
    if (!info) return;
    var starts = info.starts.slice();
    var lo = starts[stageIndex - 1] + 1;
    var hi = stageIndex + 1 < starts.length ? starts[stageIndex + 1] - 1 : info.n;
    layer = Math.max(lo, Math.min(hi, layer));
    if (layer === starts[stageIndex]) return;
    starts[stageIndex] = layer;
    var sizes = [];
    for (var i = 0; i < starts.length; i++) {
      var end = i + 1 < starts.length ? starts[i + 1] : info.n + 1;
      sizes.push(end - starts[i]);
    }
    var f = form();
    setMode("split");
    f.querySelector("#split").value = sizes.join(",");
    window.__isplanFocus = {boundary: stageIndex};
    send("");
  }

  /* The one request queue: every change goes through send(); the form's hx-sync="this:replace"
     aborts an older request in flight, and a pending debounced typing update is dropped, so the
     last action always wins and the URL comes from the response that drew the page. */
  var pending = null;
  function send(action) {
    if (pending) { clearTimeout(pending); pending = null; }
    var f = form();
    if (!f || !window.htmx) return;
    f.querySelector("#action").value = action || "";
    window.htmx.trigger(f, "plan-change");
  }
  function sendLater() {
    if (pending) clearTimeout(pending);
    pending = setTimeout(function () { pending = null; send(""); }, 250);
  }

  function setMode(mode) {
    var sel = form().querySelector("#mode");
    if (sel && sel.value !== mode) sel.value = mode;
    syncInactive();
  }
  function syncInactive() {
    var mode = form().querySelector("#mode").value;
    form().querySelectorAll(".fld[data-modes]").forEach(function (el) {
      var on = el.dataset.modes.split(" ").indexOf(mode) >= 0;
      el.classList.toggle("inactive", !on);
    });
    var note = document.getElementById("mode-note");
    if (note) note.textContent = mode === "flags" ? "" : "Fields greyed out are not used when the layout is given by " +
      (mode === "split" ? "stage sizes." : "a layout string.");
  }

  /* The layout mode follows the field the user edited. */
  function followMode(el) {
    if (el.dataset && el.dataset.setsMode) setMode(el.dataset.setsMode);
    else if (el.id === "pp" && form().querySelector("#mode").value === "split") setMode("flags");
    else if (el.id === "mode") syncInactive();
  }

  function nextFull(info, from, dir) {
    var list = dir > 0 ? info.full : info.full.slice().reverse();
    for (var i = 0; i < list.length; i++) {
      if (dir > 0 ? list[i] > from : list[i] < from) return list[i];
    }
    return from;
  }

  document.addEventListener("keydown", function (ev) {
    var b = ev.target;
    if (!b.classList || !b.classList.contains("boundary")) return;
    var info = mapInfo();
    var stage = Number(b.dataset.stage) - 1;
    var now = Number(b.getAttribute("aria-valuenow"));
    var target = null;
    if (ev.key === "ArrowRight" || ev.key === "ArrowUp") target = ev.shiftKey ? nextFull(info, now, 1) : now + 1;
    else if (ev.key === "ArrowLeft" || ev.key === "ArrowDown") target = ev.shiftKey ? nextFull(info, now, -1) : now - 1;
    else if (ev.key === "Home") target = 0;
    else if (ev.key === "End") target = info.n;
    if (target === null) return;
    ev.preventDefault();
    moveBoundary(stage, target);
  });

  /* Pointer drag: press a boundary, move over the cells, release on the layer the stage should start at. */
  var drag = null;
  document.addEventListener("pointerdown", function (ev) {
    var b = ev.target.closest && ev.target.closest(".boundary");
    if (!b) return;
    ev.preventDefault();
    b.focus();
    drag = {stage: Number(b.dataset.stage) - 1, el: b, target: Number(b.getAttribute("aria-valuenow"))};
    b.classList.add("dragging");
  });
  document.addEventListener("pointermove", function (ev) {
    if (!drag) return;
    var el = document.elementFromPoint(ev.clientX, ev.clientY);
    var cell = el && el.closest && el.closest(".cell");
    if (!cell || cell.classList.contains("mtp")) return;
    document.querySelectorAll(".cell.drop").forEach(function (c) { c.classList.remove("drop"); });
    cell.classList.add("drop");
    drag.target = Number(cell.dataset.layer);
  });
  document.addEventListener("pointerup", function () {
    if (!drag) return;
    var d = drag;
    drag = null;
    d.el.classList.remove("dragging");
    document.querySelectorAll(".cell.drop").forEach(function (c) { c.classList.remove("drop"); });
    moveBoundary(d.stage, d.target);
  });

  document.addEventListener("input", function (ev) {
    var el = ev.target;
    if (!el.form || el.form.id !== "controls") return;
    followMode(el);
    if (el.type === "text" || el.type === "number") sendLater();
  });
  document.addEventListener("change", function (ev) {
    var el = ev.target;
    if (!el.form || el.form.id !== "controls") return;
    followMode(el);
    if (el.type === "text" || el.type === "number") sendLater(); else send("");
  });
  document.addEventListener("htmx:configRequest", function (ev) {
    var a = document.getElementById("action");
    if (a && ev.detail.elt && ev.detail.elt.id === "controls") {
      if (!ev.detail.parameters.get || !ev.detail.parameters.get("action")) {
        if (ev.detail.parameters.delete) ev.detail.parameters.delete("action");
      }
      a.value = "";
    }
  });
  document.addEventListener("submit", function (ev) {
    var st = document.getElementById("plan-state");
    var q = ev.target.querySelector && ev.target.querySelector('input[name="query"]');
    if (st && q) q.value = st.dataset.query;
  });

  document.addEventListener("click", function (ev) {
    var t = ev.target;
    var act = t.closest && t.closest("button[data-action]");
    if (act) { window.__isplanFocus = {id: act.id}; send(act.dataset.action); return; }
    var fix = t.closest && t.closest("a[data-focus]");
    if (fix) {
      var target = document.getElementById(fix.dataset.focus);
      if (target) { ev.preventDefault(); target.focus(); target.scrollIntoView({block: "center"}); }
      return;
    }
    if (t.matches && t.matches("button.copy-url")) {
      var url = window.location.href;
      var done = function () { t.textContent = "Copied"; setTimeout(function () { t.textContent = "Copy share URL"; }, 1500); };
      if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(url).then(done, done);
      else done();
      t.dataset.url = url;
    }
  });

  document.addEventListener("htmx:afterSwap", function (ev) {
    // htmx 2 fires afterSwap once per swapped element (the results block and every out-of-band
    // field message); only the results block needs the figures redrawn and the inputs synced
    if (!ev.target || ev.target.id !== "results") return;
    syncForm();
    renderFigures(document.getElementById("results"));
    var want = window.__isplanFocus;
    window.__isplanFocus = null;
    if (want && typeof want.boundary === "number") {
      var b = document.querySelector('.boundary[data-stage="' + (want.boundary + 1) + '"]');
      if (b) b.focus();
    } else if (want && want.id) {
      var el = document.getElementById(want.id);
      if (el) el.focus();
    }
    document.body.dataset.updated = String(Date.now());
  });

  /* Make the form show the plan the server answered with (Balance, Nearest valid, a canonical
     value), except the field the user is typing in. */
  function syncForm() {
    var st = document.getElementById("plan-state");
    if (!st) return;
    var values = JSON.parse(st.dataset.values);
    var f = form();
    Object.keys(values).forEach(function (key) {
      var el = f.querySelector("#" + CSS.escape(key));
      if (!el || el === document.activeElement) return;
      if (el.type === "checkbox") el.checked = values[key] === "1";
      else if (el.value !== values[key]) el.value = values[key];
    });
    syncInactive();
  }

  document.addEventListener("DOMContentLoaded", function () { renderFigures(document); syncInactive(); });
})();
