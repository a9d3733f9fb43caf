// fleet's dashboard: live parts of the page from server-sent events, and small helpers.
// No build step and no framework: htmx does the forms; this keeps the streams.
//
// <div data-stream=URL data-events="a b" data-param=v data-last=ID> opens URL as an
// EventSource; an event named a replaces the content of every [data-swap=a], is appended to
// every [data-append=a], or is merged by element id into every [data-merge=a]. The id of the
// last event is kept: the browser sends it back by itself (Last-Event-ID) when the stream
// breaks, and a stream that had to be opened anew carries it as ?PARAM=ID, so that nothing
// is missed and nothing comes twice.
(function () {
  "use strict";
  const MAX_LINES = 5000;

  function apply(name, html) {
    document.querySelectorAll(`[data-swap="${name}"]`).forEach((target) => {
      target.innerHTML = html;
      if (window.htmx) htmx.process(target);
    });
    document.querySelectorAll(`[data-append="${name}"]`).forEach((target) => append(target, html));
    document.querySelectorAll(`[data-merge="${name}"]`).forEach((target) => merge(target, html));
  }

  function append(target, html) {
    const scroller = document.scrollingElement;
    const follow = target.scrollHeight - target.scrollTop - target.clientHeight < 40;
    const pageFollow = scroller.scrollHeight - scroller.scrollTop - window.innerHeight < 80;
    target.insertAdjacentHTML("beforeend", html);
    while (target.childElementCount > MAX_LINES) target.firstElementChild.remove();
    const none = document.getElementById("no-lines");
    if (none) none.remove();
    if (follow) target.scrollTop = target.scrollHeight;
    if (pageFollow && target.dataset.followPage !== undefined) scroller.scrollTop = scroller.scrollHeight;
  }

  // Children with an id stay as they are (a half-typed answer survives); new ones come in
  // order, gone ones go; children without an id are replaced.
  function merge(target, html) {
    const next = document.createElement("template");
    next.innerHTML = html;
    const wanted = Array.from(next.content.children);
    const keep = new Set(wanted.map((el) => el.id).filter(Boolean));
    Array.from(target.children).forEach((el) => {
      if (!el.id || !keep.has(el.id) || el.dataset.fresh !== undefined) el.remove();
    });
    let before = target.firstElementChild;
    wanted.forEach((el) => {
      const existing = el.id ? document.getElementById(el.id) : null;
      if (existing && existing.parentElement === target) {
        before = existing.nextElementSibling;
        return;
      }
      target.insertBefore(el, before);
      if (window.htmx) htmx.process(el);
    });
  }

  function stream(el) {
    const base = el.dataset.stream;
    const param = el.dataset.param || "v";
    const names = (el.dataset.events || "").split(/\s+/).filter(Boolean);
    let last = el.dataset.last || "";
    let delay = 1000;
    function connect() {
      const url = new URL(base, window.location.href);
      if (last) url.searchParams.set(param, last);
      const source = new EventSource(url);
      names.forEach((name) =>
        source.addEventListener(name, (event) => {
          if (event.lastEventId) last = event.lastEventId;
          delay = 1000;
          apply(name, event.data);
        })
      );
      source.addEventListener("open", () => document.body.classList.remove("offline"));
      source.addEventListener("error", () => {
        document.body.classList.add("offline");
        if (source.readyState === EventSource.CLOSED) {
          window.setTimeout(connect, delay);
          delay = Math.min(delay * 2, 30000);
        }
      });
    }
    connect();
  }

  function start() {
    document.querySelectorAll("[data-stream]").forEach(stream);
    document.body.addEventListener("click", (event) => {
      const button = event.target.closest("[data-dismiss]");
      if (button) button.parentElement.remove();
    });
    // A change made here (an added task, a bulk retry) reloads the list it changed.
    document.body.addEventListener("fleet-changed", () => {
      document.querySelectorAll("[data-refresh]").forEach((target) => {
        if (window.htmx) htmx.ajax("GET", window.location.href, { target: target, swap: "innerHTML" });
      });
    });
    const transcript = document.getElementById("transcript");
    if (transcript) transcript.scrollTop = transcript.scrollHeight;
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
