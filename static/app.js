/* isplan dashboard behaviour. No inline scripts: figures come from data-figure attributes and
   every handler is attached here, so the page runs under a strict Content-Security-Policy.

   One request queue (send / sendLater): at most one /fragment request is in flight; changes made
   meanwhile collapse into one pending request that is built from the form when it leaves, so
   the latest state always wins and no edit is lost. The URL comes from the answer that drew the
   page (its HX-Push-Url / HX-Replace-Url header). A boundary moves on screen in the same frame
   as the input (drawn and coloured from the roles in #layer-map); the server's answer follows
   and is patched in (only changed text, attributes and reshaped elements are touched); figures
   redraw with Plotly.react when they are on screen. Back/Forward redraw the state their URL
   holds. */
(function () {
  "use strict";

  /* timings for bench/browser_timing.py: work = input event to the boundary placed and laid out
     (forced layout); drawn = input event to the animation frame that shows it; answered = input
     to the server's answer drawn */
  var perf = window.__isplanPerf = {input: 0, work: [], drawn: [], answered: [], sent: 0, applied: 0};
  function timeDraw(t0) {
    var map = document.getElementById("layer-map");
    if (map) map.getBoundingClientRect();
    perf.work.push(performance.now() - t0);
    requestAnimationFrame(function () { perf.drawn.push(performance.now() - t0); });
  }
  function form() { return document.getElementById("controls"); }
  function $(sel, root) { return (root || document).querySelector(sel); }
  function $all(sel, root) { return Array.prototype.slice.call((root || document).querySelectorAll(sel)); }

  /* ------------------------------------------------------------------ figures */
  var plotlyLoading = null;
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    if (!plotlyLoading) {
      plotlyLoading = new Promise(function (resolve, reject) {
        var s = document.createElement("script");
        s.src = document.body.dataset.plotly;
        s.onload = function () { resolve(window.Plotly); };
        s.onerror = function () { plotlyLoading = null; reject(new Error("the plotting library did not load")); };
        document.head.appendChild(s);
      });
    }
    return plotlyLoading;
  }
  var PLOT_CONFIG = {displayModeBar: false, displaylogo: false, responsive: true};
  function drawFigure(el) {
    if (el.dataset.drawn === el.dataset.figure) return;
    var spec = el.dataset.figure;
    loadPlotly().then(function (Plotly) {
      var fig = JSON.parse(spec);
      return Plotly.react(el, fig.data, fig.layout, PLOT_CONFIG).then(function () { el.dataset.drawn = spec; });
    }).catch(function (e) { el.textContent = "figure unavailable: " + e.message; el.dataset.drawn = spec; });
  }
  var visible = new Set();
  var observer = ("IntersectionObserver" in window) ? new IntersectionObserver(function (entries) {
    entries.forEach(function (en) {
      if (en.isIntersecting) { visible.add(en.target); drawFigure(en.target); } else visible.delete(en.target);
    });
  }, {rootMargin: "200px"}) : null;
  function watchFigures(root) {
    $all(".plotly-figure[data-figure]", root).forEach(function (el) {
      if (observer) observer.observe(el); else drawFigure(el);
    });
  }

  /* ------------------------------------------------------------------ the layer map */
  function mapInfo() {
    var map = document.getElementById("layer-map");
    if (!map) return null;
    var list = function (s) { return s ? s.split(",").map(Number) : []; };
    return {map: map, n: Number(map.dataset.numLayers), full: list(map.dataset.full), starts: list(map.dataset.starts)};
  }
  function sourceOf(info, layer) {  // the full layer whose top-k a shared layer reuses
    var src = null;
    info.full.forEach(function (f) { if (f <= layer) src = f; });
    return src;
  }
  function stageOf(starts, layer) {
    var k = 0;
    starts.forEach(function (s, i) { if (s <= layer) k = i; });
    return k + 1;
  }

  /* Draw stage k's (0-based, k >= 1) new first layer at once: the boundary moves, the cells change
     band, the start is coloured valid (a full layer) or invalid (shared), the stage sizes field
     follows. Returns the clamped layer, or null when nothing moved. */
  function previewMove(stageIndex, layer) {
    var info = mapInfo();
    if (!info || stageIndex < 1 || stageIndex >= info.starts.length) return null;
    var starts = info.starts.slice();
    var lo = starts[stageIndex - 1] + 1;
    var hi = stageIndex + 1 < starts.length ? starts[stageIndex + 1] - 1 : info.n;
    layer = Math.max(lo, Math.min(hi, layer));
    var old = starts[stageIndex];
    if (layer === old) return null;
    starts[stageIndex] = layer;
    info.map.dataset.starts = starts.join(",");
    var b = $('.boundary[data-stage="' + (stageIndex + 1) + '"]', info.map);
    var cell = $('.cell[data-layer="' + layer + '"]', info.map);
    var oldCell = $('.cell[data-layer="' + old + '"]', info.map);
    if (!b || !cell) return null;
    var hadFocus = document.activeElement === b;
    info.map.insertBefore(b, cell);
    if (hadFocus) b.focus({preventScroll: true});  // moving a node in the DOM drops its focus
    if (oldCell) { oldCell.classList.remove("start", "invalid"); }
    cell.classList.add("start");
    var ok = info.full.indexOf(layer) >= 0;
    cell.classList.toggle("invalid", !ok);
    b.classList.toggle("invalid", !ok);
    for (var n = Math.min(old, layer); n < Math.max(old, layer); n++) {
      var c = $('.cell[data-layer="' + n + '"]', info.map);
      if (c) { var band = stageOf(starts, n) % 2; c.classList.toggle("band0", band === 0); c.classList.toggle("band1", band === 1); }
    }
    b.setAttribute("aria-valuenow", String(layer));
    // the neighbours' ranges follow: a stage keeps at least one layer
    var before = $('.boundary[data-stage="' + stageIndex + '"]', info.map);
    var after = $('.boundary[data-stage="' + (stageIndex + 2) + '"]', info.map);
    if (before) before.setAttribute("aria-valuemax", String(layer - 1));
    if (after) after.setAttribute("aria-valuemin", String(layer + 1));
    var src = sourceOf(info, layer);
    b.setAttribute("aria-valuetext", "stage " + (stageIndex + 1) + " starts at layer " + layer + (ok ? " (full)" :
      " (shared, reuses top-k of full layer " + src + " in stage " + stageOf(starts, src) + ": invalid)"));
    edited("split"); edited("mode");
    var sizes = starts.map(function (s, i) { return (i + 1 < starts.length ? starts[i + 1] : info.n + 1) - s; });
    var split = $("#split", form());
    if (split) split.value = sizes.join(",");
    setMode("split");
    return layer;
  }

  function moveBoundary(stageIndex, layer, source, tInput) {
    var moved = previewMove(stageIndex, layer);
    if (moved === null) return;
    timeDraw(tInput);
    perf.input = tInput;
    send("", source);
  }

  /* ------------------------------------------------------------------ the request queue */
  var inflight = false, want = null, timer = null, lastSource = null, lastSent = 0, focusWant = null;
  /* editGen counts local edits (typing, a previewed move) and editedAt remembers the last edit of
     each field: an answer to a request built before a field's latest edit must not write its
     (older) value back into that field; the other fields take the answered plan. */
  var editGen = 0, editedAt = {};
  function edited(key) { editedAt[key] = ++editGen; }

  /* Queue a change. A discrete action (Balance, a select, a drop) gets its own history entry;
     a burst of edits from one control within a second shares one. */
  function send(action, source, restore) {
    if (timer) { clearTimeout(timer); timer = null; }
    var now = Date.now();
    // a boundary is redrawn by every answer: it is the same control by its stage, not its node
    var key = !source ? null : source.classList && source.classList.contains("boundary")
      ? "boundary-" + source.dataset.stage : source.id || source.name || source.tagName;
    var push = !restore && (Boolean(action) || key !== lastSource || now - lastSent > 1000);
    lastSource = key; lastSent = now;
    want = want ? {action: action || want.action, push: push || want.push, restore: restore}
                : {action: action || "", push: push, restore: restore};
    pump();
  }
  function sendLater(source) {
    if (timer) clearTimeout(timer);
    perf.input = performance.now();
    timer = setTimeout(function () { timer = null; send("", source); }, 150);
  }
  function formQuery(action) {
    var params = new URLSearchParams();
    new FormData(form()).forEach(function (value, key) { if (key !== "action") params.append(key, value); });
    if (action) params.set("action", action);
    var a = document.getElementById("compare-a");
    if (a && a.dataset.query) params.set("a", a.dataset.query);
    return params.toString();
  }
  function pump() {
    if (inflight || !want || !form()) return;
    var req = want; want = null; inflight = true;
    req.gen = editGen;
    var qs = req.restore !== undefined && req.restore !== null ? req.restore : formQuery(req.action);
    var t0 = perf.input || performance.now();
    perf.sent++;
    setBusy(true);
    fetch("/fragment?" + qs, {headers: {"HX-Request": "true"}, credentials: "same-origin"}).then(function (r) {
      if (!r.ok) throw new Error("the server answered " + r.status);
      var url = r.headers.get("HX-Push-Url") || r.headers.get("HX-Replace-Url");
      return r.text().then(function (html) { return {html: html, url: url}; });
    }).then(function (ans) {
      // a newer plain edit is waiting: this answer is already out of date, skip drawing it
      // (an action's answer is drawn: the form must pick up the plan it produced)
      if (want && !req.action && req.restore == null) { want.push = want.push || req.push; return; }
      apply(ans.html, req.restore != null, req.restore != null ? Infinity : req.gen);
      if (ans.url && req.restore == null) {
        var url = compareUrl(ans.url);
        if (req.push && url !== location.pathname + location.search) history.pushState({isplan: 1}, "", url);
        else history.replaceState({isplan: 1}, "", url);
      }
      perf.answered.push(performance.now() - t0);
      perf.applied++;
      showStatus("");
    }).catch(function (e) {
      showStatus("Update failed: " + e.message + ". The page shows the last plan the server answered.", true);
    }).then(function () {
      inflight = false;
      setBusy(false);
      pump();
    });
  }
  /* For tests and benches: nothing queued, nothing in flight, no edit waiting for its pause. */
  window.__isplanIdle = function () { return !inflight && !want && !timer; };
  function setBusy(on) {
    var r = document.getElementById("results");
    if (r) r.setAttribute("aria-busy", on ? "true" : "false");
    document.documentElement.classList.toggle("htmx-request", on);
  }
  function showStatus(text, bad) {
    var s = document.getElementById("status");
    if (!s) return;
    s.textContent = text;
    s.classList.toggle("bad", Boolean(bad));
  }

  /* Replace only the blocks whose HTML changed; figures are updated in place. */
  function apply(html, restoring, builtAt) {
    var tpl = document.createElement("template");
    tpl.innerHTML = html;
    var fresh = $("#results", tpl.content), old = document.getElementById("results");
    if (!fresh || !old) return;
    var active = document.activeElement;
    var focus = focusWant || (active && active.classList && active.classList.contains("boundary")
      ? {boundary: Number(active.dataset.stage)} : active && active.id ? {id: active.id} : null);
    focusWant = null;
    var oldIds = Array.prototype.map.call(old.children, function (c) { return c.id; }).join(" ");
    var newIds = Array.prototype.map.call(fresh.children, function (c) { return c.id; }).join(" ");
    if (oldIds !== newIds || oldIds.indexOf("  ") >= 0) {
      old.replaceWith(fresh);
      watchFigures(fresh);
    } else {
      old.className = fresh.className;
      Array.prototype.slice.call(fresh.children).forEach(function (block) {
        var cur = document.getElementById(block.id);
        if (!cur) return;
        if (block.id === "plots") { updateFigures(cur, block); return; }
        if (block.id === "map" && drag) return;  // the drag's own preview is drawn; its drop sends again
        patch(cur, block);
      });
    }
    // out-of-band parts (field messages, the answered plan) keep htmx's marker attribute
    $all("[hx-swap-oob]", tpl.content).forEach(function (el) {
      var cur = document.getElementById(el.id);
      if (cur && cur.outerHTML !== el.outerHTML) cur.replaceWith(el);
    });
    syncForm(restoring, builtAt);
    restoreFocus(focus);
    document.body.dataset.updated = String(Date.now());
  }
  /* Make `cur` look like `fresh` touching only what differs: same-shaped elements keep their
     nodes (and so focus and an opened <details>); text and attributes are updated in place; an
     element whose children changed shape is replaced whole. The layer map is replaced whole
     (its boundaries move between cells; focus is restored by stage). */
  function patch(cur, fresh) {
    if (cur.isEqualNode(fresh)) return;
    var a = Array.prototype.slice.call(cur.childNodes), b = Array.prototype.slice.call(fresh.childNodes);
    var sameShape = cur.tagName === fresh.tagName && cur.id !== "map" && a.length === b.length && cur.children.length > 0 &&
      a.every(function (n, i) { return n.nodeType === b[i].nodeType && (n.nodeType !== 1 || n.tagName === b[i].tagName); });
    if (!sameShape) {
      if (cur.tagName === "DETAILS" && cur.open) fresh.open = true;
      cur.replaceWith(fresh);
      return;
    }
    Array.prototype.slice.call(cur.attributes).forEach(function (at) {
      if (!fresh.hasAttribute(at.name) && !(at.name === "open" && cur.tagName === "DETAILS")) cur.removeAttribute(at.name);
    });
    Array.prototype.slice.call(fresh.attributes).forEach(function (at) {
      if (cur.getAttribute(at.name) !== at.value) cur.setAttribute(at.name, at.value);
    });
    a.forEach(function (n, i) {
      if (n.nodeType === 1) patch(n, b[i]);
      else if (n.nodeValue !== b[i].nodeValue) n.nodeValue = b[i].nodeValue;
    });
  }
  function updateFigures(cur, fresh) {
    var ids = function (root) { return $all(".plotly-figure", root).map(function (f) { return f.id; }).join(" "); };
    if (ids(cur) !== ids(fresh)) {  // a figure came or went: draw the new set
      cur.replaceWith(fresh);
      watchFigures(fresh);
      return;
    }
    var captions = $all("figcaption", fresh);
    $all("figcaption", cur).forEach(function (c, i) {
      if (c.textContent !== captions[i].textContent) c.textContent = captions[i].textContent;
    });
    $all(".plotly-figure", fresh).forEach(function (f) {
      var el = document.getElementById(f.id);
      if (el.dataset.figure !== f.dataset.figure) {
        el.dataset.figure = f.dataset.figure;  // Plotly.react now if on screen, else when scrolled to
        if (visible.has(el) || !observer) drawFigure(el);
      }
    });
  }
  function restoreFocus(want) {
    if (!want) return;
    var el = typeof want.boundary === "number"
      ? $('.boundary[data-stage="' + want.boundary + '"]') : document.getElementById(want.id);
    if (el && document.activeElement !== el) el.focus({preventScroll: true});
  }

  /* Make the form show the plan the server answered with (Balance, Nearest valid, a canonical
     value), except the field the user is typing in (unless Back/Forward restored a state). */
  function syncForm(all, builtAt) {
    var st = document.getElementById("plan-state");
    if (!st || !form()) return;
    var values = JSON.parse(st.dataset.values);
    Object.keys(values).forEach(function (key) {
      var el = form().querySelector("#" + CSS.escape(key));
      if (!el || (!all && el === document.activeElement)) return;
      if (!all && (editedAt[key] || 0) > builtAt) return;  // edited after the request left
      if (el.type === "checkbox") el.checked = values[key] === "1";
      else if (el.value !== values[key]) el.value = values[key];
    });
    syncInactive();
  }

  /* ------------------------------------------------------------------ layout mode */
  function setMode(mode) {
    var sel = $("#mode", form());
    if (sel && sel.value !== mode) { sel.value = mode; syncInactive(); }
  }
  function syncInactive() {
    var mode = $("#mode", form()).value;
    $all(".fld[data-modes]", form()).forEach(function (el) {
      el.classList.toggle("inactive", el.dataset.modes.split(" ").indexOf(mode) < 0);
    });
    var note = document.getElementById("mode-note");
    if (note) note.textContent = mode === "flags" ? "" : "Fields greyed out are not used when the layout is given by " +
      (mode === "split" ? "stage sizes." : "a layout string.");
  }
  function followMode(el) {  // the layout mode follows the field the user edited
    if (el.dataset && el.dataset.setsMode) setMode(el.dataset.setsMode);
    else if (el.id === "pp" && $("#mode", form()).value === "split") setMode("flags");
    else if (el.id === "mode") syncInactive();
  }

  /* ------------------------------------------------------------------ keys and pointer */
  function nextFull(info, from, dir) {
    var list = dir > 0 ? info.full : info.full.slice().reverse();
    for (var i = 0; i < list.length; i++) if (dir > 0 ? list[i] > from : list[i] < from) return list[i];
    return from;
  }
  document.addEventListener("keydown", function (ev) {
    var b = ev.target;
    if (!b.classList || !b.classList.contains("boundary")) return;
    var t0 = ev.timeStamp || performance.now();  // from the input event itself, not from this handler
    var info = mapInfo();
    var now = Number(b.getAttribute("aria-valuenow"));  // already moved by earlier presses: presses add up
    var target = null;
    if (ev.key === "ArrowRight" || ev.key === "ArrowUp") target = ev.shiftKey ? nextFull(info, now, 1) : now + 1;
    else if (ev.key === "ArrowLeft" || ev.key === "ArrowDown") target = ev.shiftKey ? nextFull(info, now, -1) : now - 1;
    else if (ev.key === "PageUp") target = now + 4;
    else if (ev.key === "PageDown") target = now - 4;
    else if (ev.key === "Home") target = 0;
    else if (ev.key === "End") target = info.n;
    if (target === null) return;
    ev.preventDefault();
    moveBoundary(Number(b.dataset.stage) - 1, target, b, t0);
  });

  var drag = null;
  document.addEventListener("pointerdown", function (ev) {
    var b = ev.target.closest && ev.target.closest(".boundary");
    if (!b) return;
    ev.preventDefault();
    b.focus();
    if (b.setPointerCapture) { try { b.setPointerCapture(ev.pointerId); } catch (e) { /* synthetic events */ } }
    drag = {stage: Number(b.dataset.stage) - 1, el: b, moved: false};
    b.classList.add("dragging");
  });
  document.addEventListener("pointermove", function (ev) {
    if (!drag) return;
    var t0 = ev.timeStamp || performance.now();  // from the input event itself, not from this handler
    var hit = document.elementsFromPoint(ev.clientX, ev.clientY);
    var cell = null;
    for (var i = 0; i < hit.length && !cell; i++) if (hit[i].classList && hit[i].classList.contains("cell")) cell = hit[i];
    if (!cell || cell.classList.contains("mtp")) return;
    var layer = Number(cell.dataset.layer);
    if (layer === Number(drag.el.getAttribute("aria-valuenow"))) return;
    if (previewMove(drag.stage, layer) !== null) {
      drag.moved = true;
      timeDraw(t0);
      perf.input = t0;
      sendLater(drag.el);  // the verdict follows the drag, one request at a time
    }
  });
  function endDrag() {
    if (!drag) return;
    var d = drag;
    drag = null;
    d.el.classList.remove("dragging");
    if (d.moved) { perf.input = performance.now(); send("", d.el); }
  }
  document.addEventListener("pointerup", endDrag);
  document.addEventListener("pointercancel", endDrag);

  /* ------------------------------------------------------------------ fields */
  document.addEventListener("input", function (ev) {
    var el = ev.target;
    if (!el.form || el.form.id !== "controls") return;
    edited(el.id);
    followMode(el);
    if (el.type === "text" || el.type === "number") sendLater(el);
  });
  document.addEventListener("change", function (ev) {
    var el = ev.target;
    if (!el.form || el.form.id !== "controls") return;
    if (el.id === "engine") {  // another engine speaks another vocabulary: the server draws its form
      navigate("/?" + formQuery(""));
      return;
    }
    edited(el.id);
    followMode(el);
    perf.input = performance.now();
    send("", el);
  });
  document.addEventListener("submit", function (ev) {
    if (ev.target.id === "controls") { ev.preventDefault(); send("", ev.target); return; }
    if (ev.target.dataset.navigate) {
      ev.preventDefault();
      navigate(ev.target.action + "?" + new URLSearchParams(new FormData(ev.target)).toString());
      return;
    }
    if (ev.target.dataset.async) { ev.preventDefault(); submitAsync(ev.target); }
  });
  /* Launcher files fill the paste box. Choose the script together with the files it sources:
     each `source FILE` / `. FILE` line whose file name matches a chosen file is replaced by that
     file's text (nested up to 4 deep), as bash would read it; sources not chosen stay as they
     are (the server then says their settings are unknown). The note lists both. */
  var SOURCE_LINE = /^\s*(?:source|\.)\s+["']?([^"'\s;]+)["']?\s*(?:[;#].*)?$/;
  function sourcesOf(text) {  // the file names a script sources
    return text.split("\n").map(function (l) { var m = SOURCE_LINE.exec(l); return m ? m[1].split("/").pop() : null; })
      .filter(Boolean);
  }
  function inlineSources(main, files, depth, used, missing) {
    return main.split("\n").map(function (line) {
      var m = SOURCE_LINE.exec(line);
      if (!m) return line;
      var name = m[1].split("/").pop();
      if (!Object.prototype.hasOwnProperty.call(files, name) || depth >= 4) { missing.push(m[1]); return line; }
      used.push(name);
      return "# --- " + name + " (sourced, inlined by the page) ---\n" +
        inlineSources(files[name], files, depth + 1, used, missing) + "\n# --- end of " + name + " ---";
    }).join("\n");
  }
  document.addEventListener("change", function (ev) {
    if (ev.target.id !== "launcher-file" || !ev.target.files || !ev.target.files.length) return;
    var chosen = Array.prototype.slice.call(ev.target.files);
    var err = document.getElementById("err-launcher"), note = document.getElementById("launcher-note");
    Promise.all(chosen.map(function (f) { return f.text().then(function (t) { return {name: f.name, text: t}; }); }))
      .then(function (read) {
        var files = {}, sourced = {};
        read.forEach(function (f) { files[f.name] = f.text; sourcesOf(f.text).forEach(function (n) { sourced[n] = true; }); });
        // the script is the chosen file no other chosen file sources
        var main = read.filter(function (f) { return !sourced[f.name]; })[0] || read[0];
        var used = [], missing = [];
        document.getElementById("launcher").value = inlineSources(main.text, files, 0, used, missing);
        if (err) err.textContent = "";
        if (note) note.textContent = "Read " + main.name + (used.length ? "; inlined " + used.join(", ") : "") +
          (missing.length ? "; not chosen, so unknown: " + missing.join(", ") : "") + ".";
      }).catch(function (e) { if (err) err.textContent = "launcher: the file could not be read (" + e.message + ")"; });
  });

  window.addEventListener("popstate", function () {  // Back / Forward: draw the state the URL holds
    setCompare(new URLSearchParams(location.search).get("a"));
    send("", null, location.search.slice(1));  // the fragment reads the pinned plan A from a= too
  });

  /* ------------------------------------------------------------------ upload, launcher, search */
  function submitAsync(f) {
    var errId = f.dataset.error, err = document.getElementById(errId);
    var script = f.querySelector("textarea[name=script]");
    if (script && !script.value.trim()) {  // an empty paste is not a plan: say so, change nothing
      if (err) err.textContent = "launcher: paste a launcher script (or choose its file) first";
      script.focus();
      return;
    }
    var q = f.querySelector('input[name="query"]'), st = document.getElementById("plan-state");
    if (q && st) q.value = st.dataset.query;
    var button = f.querySelector("button[type=submit]");
    if (button) button.disabled = true;
    var done = function () { if (button) button.disabled = false; };
    var req;
    if (f.method.toLowerCase() === "post") {
      req = fetch(f.action, {method: "POST", body: new FormData(f), credentials: "same-origin"});
    } else {  // the search runs on the plan on screen (model, GPU, sequence) with the budget asked
      var params = new URLSearchParams(st ? st.dataset.query : "");
      new FormData(f).forEach(function (value, key) { if (key !== "query") params.set(key, value); });
      req = fetch(f.action + "?" + params.toString(), {credentials: "same-origin"});
    }
    req.then(function (r) {
      if (r.redirected && r.ok) { navigate(r.url); done(); return; }
      return r.text().then(function (html) {
        done();
        var tpl = document.createElement("template");
        tpl.innerHTML = html;
        if (f.dataset.target) {  // a fragment answer (the search): drawn where the form says
          var target = document.getElementById(f.dataset.target);
          var fresh = $("#" + f.dataset.target, tpl.content);
          if (target && fresh) target.replaceWith(fresh);
          if (err) err.textContent = r.ok ? "" : (fresh ? "" : "search failed: the server answered " + r.status);
          return;
        }
        var msg = $("#" + (f.dataset.errorFrom || errId), tpl.content);
        if (err) err.textContent = msg && msg.textContent ? msg.textContent : "refused: the server answered " + r.status;
      });
    }).catch(function (e) { done(); if (err) err.textContent = "request failed: " + e.message; });
  }
  /* Load a plan URL (an upload's redirect, a preset, a search result): a new page and history
     entry (a new model changes the form's choices, so the whole page is drawn by the server). */
  function navigate(url) {
    var u = new URL(url, location.href);
    location.assign(u.pathname + u.search);
  }

  /* ------------------------------------------------------------------ compare */
  function setCompare(query) {
    var a = document.getElementById("compare-a");
    if (!a) return;
    a.dataset.query = query || "";
  }
  function compareUrl(url) {
    var a = document.getElementById("compare-a");
    if (!a || !a.dataset.query) return url;
    return url + (url.indexOf("?") >= 0 ? "&" : "?") + "a=" + encodeURIComponent(a.dataset.query);
  }

  /* ------------------------------------------------------------------ clicks */
  function copyText(button, text) {
    var label = button.dataset.label || (button.dataset.label = button.textContent);
    var say = function (msg, bad) {
      button.textContent = msg;
      button.classList.toggle("bad", Boolean(bad));
      setTimeout(function () { button.textContent = label; button.classList.remove("bad"); }, 2500);
    };
    if (!navigator.clipboard || !navigator.clipboard.writeText) {
      say("Copy failed: no clipboard access here; select the text and copy it", true);
      return;
    }
    navigator.clipboard.writeText(text).then(function () { say("Copied"); },
      function () { say("Copy failed: the browser refused clipboard access; select the text and copy it", true); });
  }
  document.addEventListener("click", function (ev) {
    var t = ev.target;
    var act = t.closest && t.closest("button[data-action]");
    if (act) { focusWant = {id: act.id}; perf.input = performance.now(); send(act.dataset.action, act); return; }
    var fix = t.closest && t.closest("a[data-focus]");
    if (fix) {
      var target = document.getElementById(fix.dataset.focus);
      if (target) { ev.preventDefault(); target.focus(); target.scrollIntoView({block: "center"}); }
      return;
    }
    var dismiss = t.closest && t.closest("button[data-dismiss]");
    if (dismiss) {
      var box = document.getElementById(dismiss.dataset.dismiss);
      if (box) box.innerHTML = "";
      var gpus = document.getElementById("search-gpus");
      if (gpus) gpus.focus();
      return;
    }
    var toStart = t.closest && t.closest('a[href="#start"]');
    if (toStart) { var st0 = document.getElementById("start"); if (st0) st0.open = true; }
    var pick = t.closest && t.closest("a.load-plan");
    if (pick) { ev.preventDefault(); navigate(pick.getAttribute("href")); return; }
    var copy = t.closest && t.closest("button[data-copy]");
    if (copy) {
      var what = copy.dataset.copy;
      var text = what === "url" ? location.href : ($(what) || {}).textContent || "";
      copy.dataset.copied = text;
      copyText(copy, text);
      return;
    }
    var pin = t.closest && t.closest("button[data-compare]");
    if (pin) {
      var st = document.getElementById("plan-state");
      setCompare(pin.dataset.compare === "pin" && st ? st.dataset.query : "");
      focusWant = {id: pin.dataset.compare === "pin" ? "compare-clear" : "compare-pin"};
      send("", pin);
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var start = document.getElementById("start");
    if (start && window.matchMedia && window.matchMedia("(max-width: 600px)").matches) start.open = false;
    watchFigures(document);
    syncInactive();
    var q = new URLSearchParams(location.search);
    setCompare(q.get("a"));
    document.body.dataset.ready = "1";
    if (performance.mark) performance.mark("isplan-ready");
  });
})();
