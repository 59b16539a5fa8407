/* isplan: what htmx cannot do. htmx (static/vendor/) sends every request - the settings form to
   /fragment with hx-sync="this:queue last", the start bar's forms, the lazy schedule - and morphs
   the answers in (idiomorph). This file only: draws a moved boundary in the same frame as the
   input (the layer-map preview) and handles the pointer and keys on the map; draws the Plotly
   figures on screen once a swap settled; copies to the clipboard (selecting the text where the
   browser gives no clipboard); and tells htmx what the server cannot know (push or replace
   history, an action asked, an answer already out of date). No inline script: strict CSP. */
(function () {
  "use strict";
  /* timings for bench/browser_timing.py: work = input event to the boundary placed and laid out,
     drawn = input event to the animation frame that shows it, answered = input to the answer drawn */
  var perf = window.__isplanPerf = {input: 0, work: [], drawn: [], answered: [], sent: 0, applied: 0};
  var editGen = 0, answeredGen = 0, inflight = 0, lastKey = null, lastAt = 0, owedPush = false, drag = null;
  var editedAt = {}, reqGen = Infinity, focusNext = null;
  function $(sel, root) { return (root || document).querySelector(sel); }
  function $all(sel, root) { return Array.prototype.slice.call((root || document).querySelectorAll(sel)); }
  function form() { return document.getElementById("controls"); }
  function edited(key) { editedAt[key] = ++editGen; perf.input = performance.now(); }
  /* for tests and benches: nothing in flight and every edit answered */
  window.__isplanIdle = function () { return inflight === 0 && answeredGen >= editGen; };

  /* ------------------------------------------------------------------ figures */
  var plotly = null;
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    return plotly || (plotly = new Promise(function (ok, fail) {
      var s = document.createElement("script");
      s.src = document.body.dataset.plotly;
      s.onload = function () { ok(window.Plotly); };
      s.onerror = function () { plotly = null; fail(new Error("the plotting library did not load")); };
      document.head.appendChild(s);
    }));
  }
  function draw(el) {
    var spec = el.dataset.figure;
    if (!spec || el.dataset.drawn === spec) return;
    loadPlotly().then(function (P) {
      var fig = JSON.parse(spec);
      return P.react(el, fig.data, fig.layout, {displayModeBar: false, displaylogo: false, responsive: true});
    }).then(function () { el.dataset.drawn = spec; },
      function (e) { el.textContent = "figure unavailable: " + e.message; el.dataset.drawn = spec; });
  }
  var seen = new Set();
  var observer = new IntersectionObserver(function (entries) {
    entries.forEach(function (en) {
      if (en.isIntersecting) { seen.add(en.target); draw(en.target); } else seen.delete(en.target);
    });
  }, {rootMargin: "200px"});
  function figures() {  // new figures are watched; changed ones on screen are redrawn (Plotly.react)
    $all(".plotly-figure[data-figure]").forEach(function (el) { observer.observe(el); if (seen.has(el)) draw(el); });
  }

  /* ------------------------------------------------------------------ the layer map */
  function mapInfo() {
    var map = document.getElementById("layer-map");
    if (!map || !map.dataset.starts || map.dataset.movable !== "1") return null;
    var list = function (s) { return s ? s.split(",").map(Number) : []; };
    return {map: map, n: Number(map.dataset.numLayers), full: list(map.dataset.full), starts: list(map.dataset.starts),
            blocking: map.dataset.blocking === "1"};
  }
  function stageOf(starts, layer) { var k = 0; starts.forEach(function (s, i) { if (s <= layer) k = i; }); return k + 1; }
  function nextFull(info, from, dir) {
    var list = dir > 0 ? info.full : info.full.slice().reverse();
    for (var i = 0; i < list.length; i++) if (dir > 0 ? list[i] > from : list[i] < from) return list[i];
    return from;
  }
  /* Draw stage k's (0-based, k >= 1) new first layer now: the boundary moves, the cells change band,
     the start is coloured valid (full) or invalid (shared, where the engine blocks it), the stage
     sizes field follows. Returns the clamped layer, or null when nothing moved. */
  function previewMove(k, layer) {
    var info = mapInfo();
    if (!info || k < 1 || k >= info.starts.length) return null;
    var starts = info.starts.slice();
    layer = Math.max(starts[k - 1] + 1, Math.min(k + 1 < starts.length ? starts[k + 1] - 1 : info.n, layer));
    var old = starts[k];
    var b = $("#bnd-" + (k + 1)), cell = $("#L" + layer), oldCell = $("#L" + old);
    if (layer === old || !b || !cell) return null;
    starts[k] = layer;
    info.map.dataset.starts = starts.join(",");
    var focused = document.activeElement === b;
    if (info.map.moveBefore) info.map.moveBefore(b, cell);  // a state-preserving move: focus stays
    else { info.map.insertBefore(b, cell); if (focused) b.focus({preventScroll: true}); }  // this drops it
    if (oldCell) oldCell.classList.remove("start", "invalid");
    var bad = info.blocking && info.full.indexOf(layer) < 0;
    cell.classList.add("start");
    cell.classList.toggle("invalid", bad);
    b.classList.toggle("invalid", bad);
    for (var n = Math.min(old, layer); n < Math.max(old, layer); n++) {
      var c = $("#L" + n), band = stageOf(starts, n) % 2;
      if (c) { c.classList.toggle("band0", band === 0); c.classList.toggle("band1", band === 1); }
    }
    b.setAttribute("aria-valuenow", String(layer));
    b.setAttribute("aria-valuetext", "stage " + (k + 1) + " starts at layer " + layer + (bad ? " (shared: invalid)" : ""));
    var before = $("#bnd-" + k), after = $("#bnd-" + (k + 2));
    if (before) before.setAttribute("aria-valuemax", String(layer - 1));
    if (after) after.setAttribute("aria-valuemin", String(layer + 1));
    var sizes = starts.map(function (s, i) { return (i + 1 < starts.length ? starts[i + 1] : info.n + 1) - s; });
    $("#split").value = sizes.join(",");
    $("#mode").value = "split";  // stage sizes now describe the layout: what only flags described goes
    $all("[data-modes]", form()).forEach(function (f) {
      var input = $("input", f);
      if (f.dataset.modes.split(" ").indexOf("split") < 0 && input && (input.value || input.checked)) {
        input.value = input.type === "checkbox" ? input.value : ""; input.checked = false; edited(input.name);
      }
    });
    edited("split"); editedAt.mode = editGen;
    return layer;
  }
  function moved(t0, source) {  // the server's answer follows: one request in flight, the latest state next
    document.getElementById("layer-map").getBoundingClientRect();  // forced layout: the boundary is placed
    perf.work.push(performance.now() - t0);
    requestAnimationFrame(function () { perf.drawn.push(performance.now() - t0); });
    perf.input = t0;  // the request is built after the frame that shows the move
    requestAnimationFrame(function () { setTimeout(function () { htmx.trigger(form(), "isplan:edit", {source: source}); }); });
  }
  document.addEventListener("keydown", function (ev) {
    var t = ev.target, info = mapInfo();
    if (!t.classList || !info) return;
    if (t.classList.contains("cell")) {  // read the layers one by one: a roving tabindex
      var step = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1}[ev.key];
      var next = step ? (step > 0 ? t.nextElementSibling : t.previousElementSibling) : null;
      while (next && !next.classList.contains("cell")) next = step > 0 ? next.nextElementSibling : next.previousElementSibling;
      if (ev.key === "Home" || ev.key === "End") next = ev.key === "Home" ? $(".cell", info.map) : $all(".cell", info.map).pop();
      if (next) { ev.preventDefault(); t.tabIndex = -1; next.tabIndex = 0; next.focus(); }
      return;
    }
    if (!t.classList.contains("boundary")) return;
    var now = Number(t.getAttribute("aria-valuenow")), shift = ev.shiftKey;  // presses add up
    var target = {ArrowRight: shift ? nextFull(info, now, 1) : now + 1, ArrowUp: now + 1, PageUp: now + 4,
                  ArrowLeft: shift ? nextFull(info, now, -1) : now - 1, ArrowDown: now - 1, PageDown: now - 4,
                  Home: 0, End: info.n}[ev.key];
    if (target === undefined) return;
    ev.preventDefault();
    if (previewMove(Number(t.dataset.stage) - 1, target) !== null) moved(ev.timeStamp || performance.now(), "bnd-" + t.dataset.stage);
  });
  document.addEventListener("pointerdown", function (ev) {
    var b = ev.target.closest && ev.target.closest(".boundary");
    if (!b) return;
    ev.preventDefault();
    b.focus();
    try { b.setPointerCapture(ev.pointerId); } catch (e) { /* synthetic events have no capture */ }
    drag = {stage: Number(b.dataset.stage) - 1, el: b, moved: false};
    b.classList.add("dragging");
  });
  document.addEventListener("pointermove", function (ev) {
    if (!drag) return;
    var t0 = ev.timeStamp || performance.now();
    var cell = document.elementsFromPoint(ev.clientX, ev.clientY).filter(function (e) {
      return e.classList && e.classList.contains("cell") && !e.classList.contains("mtp"); })[0];
    if (cell && previewMove(drag.stage, Number(cell.dataset.layer)) !== null) { drag.moved = true; moved(t0, drag.el.id); }
  });
  function endDrag() {
    if (!drag) return;
    var d = drag;
    drag = null;
    d.el.classList.remove("dragging");
    if (d.moved) { edited("split"); htmx.trigger(form(), "isplan:edit", {source: d.el.id}); }
  }
  document.addEventListener("pointerup", endDrag);
  document.addEventListener("pointercancel", endDrag);

  /* ------------------------------------------------------------------ what htmx asks us */
  document.addEventListener("input", function (ev) {
    var el = ev.target;
    if (!el.form || el.form.id !== "controls") return;
    edited(el.name);
    if (el.dataset.setsMode) { $("#mode").value = el.dataset.setsMode; editedAt.mode = editGen; }
  });
  document.addEventListener("change", function (ev) {
    if (ev.target.form && ev.target.form.id === "controls" && ev.target.type !== "text") edited(ev.target.name);
  });
  document.addEventListener("click", function (ev) {  // Balance, Nearest valid, Pin: a value the next request carries; Copy
    var t = ev.target.closest && ev.target.closest("[data-action], [data-compare]");
    if (t) {
      if (t.dataset.action) $("#action").value = t.dataset.action;
      else { $("#compare-a").value = t.dataset.compare; focusNext = t.dataset.compare ? "compare-clear" : "compare-pin"; }
      edited(t.id);
      htmx.trigger(form(), "isplan:edit", {source: t.id});
      return;
    }
    var fix = ev.target.closest && ev.target.closest("a[data-focus]");
    var field = fix && document.getElementById(fix.dataset.focus);
    if (field) { ev.preventDefault(); field.focus(); field.scrollIntoView({block: "center"}); }
    var b = ev.target.closest && ev.target.closest("button[data-copy]");
    if (b) copy(b);
  });
  document.addEventListener("htmx:configRequest", function (ev) {
    var d = ev.detail, p = d.parameters;
    if (d.elt !== form()) return;
    Object.keys(p).forEach(function (k) { if (p[k] === "") delete p[k]; });  // blank: not a setting
    var src = d.triggeringEvent && (d.triggeringEvent.detail && d.triggeringEvent.detail.source || d.triggeringEvent.target.name);
    var push = Boolean(p.action) || owedPush || src !== lastKey || Date.now() - lastAt > 1000;
    lastKey = src; lastAt = Date.now();
    d.headers["X-Isplan-History"] = push ? "push" : "replace";
    $("#action").value = "";  // an action runs once, on the state it was asked for
    d.headers["X-Isplan-Gen"] = String(editGen);  // and the form it draws now (unchanged: not sent back)
    d.headers["X-Isplan-Form"] = form().dataset.mode + (form().querySelector(".field-error:not(:empty)") ? ":errors" : ":clean");
  });
  document.addEventListener("htmx:beforeRequest", function (ev) {  // counted on the request itself: its
    var xhr = ev.detail.xhr, gen = Number((ev.detail.requestConfig.headers || {})["X-Isplan-Gen"]);  // element may go
    inflight++; perf.sent++;
    xhr.addEventListener("loadend", function () { inflight--; if (!isNaN(gen)) answeredGen = Math.max(answeredGen, gen); });
  });
  document.addEventListener("htmx:afterRequest", function (ev) {
    var status = $("#status");
    if (status && ev.detail.requestConfig && ev.detail.requestConfig.elt === form()) {
      status.textContent = ev.detail.successful ? "" : "Update failed: the server did not answer. The page shows the last plan it answered.";
    }
  });
  document.addEventListener("htmx:beforeSwap", function (ev) {  // an answer to a state already edited: skip it
    var h = ev.detail.requestConfig && ev.detail.requestConfig.headers || {};
    var gen = Number(h["X-Isplan-Gen"]), plain = ev.detail.requestConfig && !ev.detail.requestConfig.parameters.action;
    reqGen = Infinity;
    if (!ev.detail.requestConfig || ev.detail.requestConfig.elt !== form()) return;
    if (drag || (plain && gen < editGen)) {  // a drag draws its own preview; its drop sends again
      ev.detail.shouldSwap = false;
      owedPush = owedPush || h["X-Isplan-History"] === "push";
    } else { owedPush = false; reqGen = gen; }
  });
  /* idiomorph: keep what the user has and the server cannot know */
  Idiomorph.defaults.callbacks.beforeNodeMorphed = function (old, fresh) {
    if (old.nodeType !== 1) return true;
    if (old.classList.contains("plotly-figure")) {  // Plotly owns its children: hand it the new figure
      if (fresh.dataset && fresh.dataset.figure && fresh.dataset.figure !== old.dataset.figure) old.dataset.figure = fresh.dataset.figure;
      return false;
    }
    if (old.name && old.form && old.form.id === "controls" && old.type !== "hidden") {
      return old !== document.activeElement && !((editedAt[old.name] || 0) > reqGen);  // edited since it left
    }
    return !(old.isEqualNode(fresh) && !old.closest("form"));  // identical (a form's values aside): left as it is
  };
  Idiomorph.defaults.callbacks.beforeAttributeUpdated = function (name, node) {
    return !(name === "open" && node.tagName === "DETAILS");  // an opened <details> stays open
  };
  document.addEventListener("htmx:afterSettle", function (ev) {
    figures();
    if (ev.target.id === "results") {
      var next = focusNext && document.getElementById(focusNext);  // the button that replaced the one pressed
      if (next) { next.focus(); focusNext = null; }
      perf.answered.push(performance.now() - perf.input);
      perf.applied++;
      document.body.dataset.updated = String(Date.now());
    }
  });
  document.addEventListener("htmx:historyRestore", figures);

  /* ------------------------------------------------------------------ the clipboard */
  function say(button, text, bad) {
    var note = document.getElementById("copy-note");
    var label = button.dataset.label || (button.dataset.label = button.textContent);
    button.textContent = bad ? "Copy failed: text selected" : text.indexOf(":") > 0 ? "Copied (selected)" : text;
    button.classList.toggle("bad", Boolean(bad));
    if (note) note.textContent = text === "Copied" ? "" : text;
    setTimeout(function () { button.textContent = label; button.classList.remove("bad"); }, 4000);
  }
  function selectText(el, button, why) {  // no clipboard here (plain HTTP): select it for Ctrl+C
    var range = document.createRange();
    range.selectNodeContents(el);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    var copied = false;
    try { copied = document.execCommand("copy"); } catch (e) { copied = false; }
    say(button, why + ": the text is selected" + (copied ? " and was copied the old way" : "; press Ctrl+C (⌘C) to copy it"),
        !copied);
  }
  function copy(b) {
    var el = b.dataset.copy === "url" ? null : $(b.dataset.copy);
    var text = el ? el.textContent : location.href;
    b.dataset.copied = text;
    if (!el) {  // the URL: shown in a field so it can be selected
      el = document.getElementById("share-url") || document.createElement("pre");
      el.id = "share-url"; el.className = "share-url"; el.textContent = text; b.after(el);
    }
    if (!window.isSecureContext || !navigator.clipboard || !navigator.clipboard.writeText) {
      selectText(el, b, "this page is not on a secure origin (HTTPS or localhost), so the browser gives it no clipboard");
      return;
    }
    navigator.clipboard.writeText(text).then(function () { say(b, "Copied"); },
      function () { selectText(el, b, "the browser refused clipboard access"); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    figures();
    document.body.dataset.ready = "1";
    if (performance.mark) performance.mark("isplan-ready");
  });
})();
