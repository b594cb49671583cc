// Cairn dashboard: live updates over Server-Sent Events and the operator's
// buttons. Everything user-supplied is written with textContent, never as
// HTML. Actions post JSON to the API with the X-Cairn-CSRF header that a
// cross-site form cannot send.
"use strict";

function cell(row, text, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  td.textContent = text == null ? "" : String(text);
  row.appendChild(td);
  return td;
}

function when(ts) {
  if (typeof ts !== "number") return "-";
  const d = new Date(ts * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
         `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

function live(state) {
  const badge = document.getElementById("live");
  if (badge) badge.dataset.state = state;
}

function statusSpan(status) {
  const span = document.createElement("span");
  span.className = "status s-" + String(status).replace(/[^a-z_]/g, "");
  span.textContent = status;
  return span;
}

function runsPage(table) {
  const wantStatus = table.dataset.status;
  const wantWorkflow = table.dataset.workflow;
  const body = table.tBodies[0];
  const source = new EventSource("/api/events");
  source.onopen = () => live("open");
  source.onerror = () => live("reconnecting");
  source.onmessage = (message) => {
    const run = JSON.parse(message.data).run;
    if (!run) return;
    let row = Array.from(body.rows).find((r) => r.dataset.runId === run.run_id);
    const matches = (!wantStatus || run.status === wantStatus) && (!wantWorkflow || run.workflow === wantWorkflow);
    if (!matches) {
      if (row) row.remove();
      return;
    }
    if (!row) {
      const empty = body.querySelector("tr.empty");
      if (empty) empty.remove();
      row = document.createElement("tr");
      row.dataset.runId = run.run_id;
      const id = cell(row, "", "id");
      const link = document.createElement("a");
      link.href = "/runs/" + encodeURIComponent(run.run_id);
      link.textContent = run.run_id;
      id.appendChild(link);
      cell(row, run.workflow);
      cell(row, "").appendChild(statusSpan(run.status));
      cell(row, run.queue);
      cell(row, when(run.created_at));
      cell(row, when(run.updated_at), "updated");
      body.insertBefore(row, body.firstChild);
      return;
    }
    const status = row.cells[2];
    status.replaceChildren(statusSpan(run.status));
    row.cells[5].textContent = when(run.updated_at);
  };
}

function runPage(table) {
  const runId = table.dataset.runId;
  const body = table.tBodies[0];
  const after = table.dataset.lastSeq || "0";
  const source = new EventSource("/api/runs/" + encodeURIComponent(runId) + "/events?after=" + encodeURIComponent(after));
  source.onopen = () => live("open");
  source.onerror = () => live("reconnecting");
  source.onmessage = (message) => {
    const e = JSON.parse(message.data);
    if (body.querySelector(`tr[data-seq="${Number(e.seq)}"]`)) return;
    const row = document.createElement("tr");
    row.dataset.seq = String(e.seq);
    cell(row, e.seq);
    cell(row, when(e.at));
    cell(row, e.event);
    cell(row, e.position);
    cell(row, e.name);
    const detail = cell(row, "");
    const pre = document.createElement("pre");
    pre.textContent = pretty("result" in e ? e.result : "arguments" in e ? e.arguments : e.detail || "");
    detail.appendChild(pre);
    body.appendChild(row);
  };
  source.addEventListener("end", (message) => {
    const end = JSON.parse(message.data);
    const status = document.getElementById("run-status");
    if (status) {
      status.textContent = end.status;
      status.className = "status s-" + String(end.status).replace(/[^a-z_]/g, "");
    }
    live("ended");
    source.close();
  });
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Cairn-CSRF": "1"},
    body: JSON.stringify(body || {}),
    credentials: "same-origin",
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.message || response.statusText);
  return answer;
}

function actions(box) {
  const runId = box.dataset.runId;
  const message = document.getElementById("action-message");
  box.addEventListener("click", async (event) => {
    const action = event.target.dataset && event.target.dataset.action;
    if (!action) return;
    try {
      await post("/api/runs/" + encodeURIComponent(runId) + "/" + action);
      window.location.reload();
    } catch (err) {
      message.textContent = err.message;
    }
  });
}

function resolveForm(form) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const done = event.submitter && event.submitter.value === "true";
    const text = form.elements.result.value;
    let result = null;
    try {
      result = done ? JSON.parse(text) : null;
    } catch (err) {
      alert("the result is not JSON: " + err.message);
      return;
    }
    const path = "/api/runs/" + encodeURIComponent(form.dataset.runId) + "/operations/" +
                 encodeURIComponent(form.dataset.position) + "/resolve";
    try {
      await post(path, {done: done, result: result});
      window.location.reload();
    } catch (err) {
      alert(err.message);
    }
  });
}

// A sign-in link may carry the token in its fragment (/login#token=...): the
// fragment never reaches the server or its logs; it is posted once and cleared.
function loginFromFragment(form) {
  const match = /^#token=(.+)$/.exec(window.location.hash);
  if (!match) return;
  history.replaceState(null, "", window.location.pathname + window.location.search);
  form.elements.token.value = decodeURIComponent(match[1]);
  form.submit();
}

document.addEventListener("DOMContentLoaded", () => {
  const login = document.getElementById("login");
  if (login) loginFromFragment(login);
  const runs = document.getElementById("runs");
  if (runs) runsPage(runs);
  const timeline = document.getElementById("timeline");
  if (timeline) runPage(timeline);
  document.querySelectorAll(".actions").forEach(actions);
  document.querySelectorAll("form.resolve").forEach(resolveForm);
});
