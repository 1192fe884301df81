// Steward console: the only script the pages load (the Content-Security-Policy allows no
// other and no inline code). It does two things: asks before forms marked data-confirm are
// sent, and keeps an environment's live section current from server-sent events (pushed by
// the server: an idle page sends no requests).
"use strict";

document.addEventListener("submit", (e) => {
  const form = e.target;
  const question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    e.preventDefault();
  }
});

function setText(id, text) {
  const el = document.getElementById(id);
  if (el) el.textContent = text;
}

function showLive(doc) {
  const bar = document.getElementById("deploy-progress");
  if (bar) bar.value = doc.percent;
  setText("progress-text", doc.percent + " %");
  setText("phase", doc.phase);
  setText("live-version", doc.version === null ? "—" : String(doc.version));
  setText("working-on", doc.working_on.length ? doc.working_on.join(", ") : "nothing");
  const health = document.getElementById("health");
  if (health) {
    health.textContent = doc.health;
    health.className = "health health-" + doc.health;
  }
  const counts = document.getElementById("state-counts");
  if (counts) {
    counts.replaceChildren();
    for (const [state, n] of Object.entries(doc.by_status)) {
      const li = document.createElement("li");
      li.className = "st st-" + state;
      li.textContent = state + " " + n;
      counts.appendChild(li);
    }
  }
  document.body.dataset.liveUpdates = String(Number(document.body.dataset.liveUpdates || 0) + 1);
}

function follow() {
  const live = document.querySelector("[data-events]");
  if (!live || !window.EventSource) return;
  const source = new EventSource(live.getAttribute("data-events"));
  source.addEventListener("progress", (e) => {
    try {
      showLive(JSON.parse(e.data));
    } catch (err) {
      console.error("steward: bad live update", err);
    }
  });
  source.addEventListener("signed-out", () => {
    source.close();
    setText("phase", "signed out: reload the page to sign in again");
  });
  source.addEventListener("gone", () => {
    source.close();
    setText("phase", "this environment was deleted");
  });
}

document.addEventListener("DOMContentLoaded", follow);
