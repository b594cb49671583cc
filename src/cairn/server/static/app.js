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
    soon("run", () => refreshRun(runId));
  };
  source.addEventListener("end", (message) => {
    const end = JSON.parse(message.data);
    // The status and the result change together, from the run as it is now:
    // setting the status first showed "completed" beside the old result.
    // The end event's status only where the run cannot be read.
    refreshRun(runId)
      .then((shown) => { if (!shown) setStatus(end.status); })
      .catch(() => { setStatus(end.status); })
      .finally(() => { live("ended"); });
    source.close();
  });
}

const timers = {};

// Run ``fn`` once after a burst of calls (a run writes many entries at once).
function soon(name, fn) {
  clearTimeout(timers[name]);
  timers[name] = setTimeout(fn, 150);
}

function setStatus(value) {
  const status = document.getElementById("run-status");
  if (!status) return;
  status.textContent = value;
  status.className = "status s-" + String(value).replace(/[^a-z_]/g, "");
}

// The run's status, result and approvals as they are now (after a live
// entry); whether the run could be read. The result is written before the
// status, in the same task: whoever sees the new status sees its result.
async function refreshRun(runId) {
  const response = await fetch("/api/runs/" + encodeURIComponent(runId), {credentials: "same-origin"});
  if (!response.ok) return false;
  const run = await response.json();
  const result = document.getElementById("run-result");
  if (result) result.textContent = pretty(run.error ? run.error : run.result);
  setStatus(run.status);
  const box = document.getElementById("approvals");
  if (box) await refreshApprovals(box);
  return true;
}

function approvalsUrl(box) {
  return box.dataset.scope === "run"
    ? "/api/runs/" + encodeURIComponent(box.dataset.runId) + "/approvals"
    : "/api/approvals";
}

function signature(list) {
  return list.map((a) => a.request_id + ":" + a.status).join("|");
}

function shownSignature(box) {
  return Array.from(box.querySelectorAll("article.approval")).map((el) =>
    el.dataset.requestId + ":" + el.querySelector(".status").textContent).join("|");
}

// Rebuild the list like templates/_approvals.html does, with textContent only;
// left alone while nothing changed, so a half-typed edit is not lost.
async function refreshApprovals(box) {
  const response = await fetch(approvalsUrl(box), {credentials: "same-origin"});
  if (!response.ok) return;
  const list = (await response.json()).approvals;
  if (signature(list) === shownSignature(box)) return;
  const canOperate = box.dataset.canOperate === "true";
  const nodes = list.map((a) => approvalNode(a, canOperate, box.dataset.scope !== "run"));
  if (!nodes.length) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "No approval requests.";
    nodes.push(empty);
  }
  box.replaceChildren(...nodes);
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text != null) node.textContent = String(text);
  return node;
}

function approvalNode(a, canOperate, withRun) {
  const article = el("article", "approval");
  article.dataset.runId = a.run_id;
  article.dataset.requestId = a.request_id;
  const head = el("header");
  head.appendChild(el("strong", "approval-action", a.action));
  head.appendChild(statusSpan(a.status));
  if (withRun) {
    const link = el("a", "id", a.run_id);
    link.href = "/runs/" + encodeURIComponent(a.run_id);
    head.appendChild(link);
  }
  head.appendChild(el("span", "fixed", "requested " + when(a.requested_at)));
  if (a.decided_by) head.appendChild(el("span", "fixed", "by " + a.decided_by + (a.comment ? ": " + a.comment : "")));
  article.appendChild(head);
  article.appendChild(el("pre", "approval-details", pretty(a.details)));
  if (a.status === "edited") {
    article.appendChild(el("p", "fixed", "edited to"));
    article.appendChild(el("pre", "approval-edited", pretty(a.edited)));
  }
  if (a.pending && canOperate) {
    const form = el("form", "decide");
    const label = el("label", null, "Proposed value (JSON; change it to approve with an edit)");
    const area = el("textarea");
    area.name = "edit";
    area.spellcheck = false;
    area.value = pretty(a.details);
    label.appendChild(area);
    form.appendChild(label);
    const buttons = el("div", "buttons");
    const comment = el("label", null, "Comment ");
    const input = el("input");
    input.name = "comment";
    input.maxLength = 4000;
    comment.appendChild(input);
    buttons.appendChild(comment);
    for (const [value, text] of [["approve", "Approve"], ["edit", "Approve with edit"], ["reject", "Reject"]]) {
      const button = el("button", null, text);
      button.type = "submit";
      button.value = value;
      buttons.appendChild(button);
    }
    const error = el("span", "error approval-error");
    error.setAttribute("role", "alert");
    buttons.appendChild(error);
    form.appendChild(buttons);
    article.appendChild(form);
  }
  return article;
}

// Decisions: delegated, so rebuilt forms work too. An edit that is not JSON,
// or that the server refuses (422: it does not fit the request's schema), is
// shown in the form and nothing changes.
function approvals(box) {
  box.addEventListener("submit", async (event) => {
    const form = event.target.closest("form.decide");
    if (!form) return;
    event.preventDefault();
    const article = form.closest("article.approval");
    const error = form.querySelector(".approval-error");
    const verb = event.submitter ? event.submitter.value : "approve";
    const body = {};
    const comment = form.elements.comment.value;
    if (comment) body.comment = comment;
    if (verb === "edit") {
      try {
        body.edit = JSON.parse(form.elements.edit.value);
      } catch (err) {
        error.textContent = "the edit is not JSON: " + err.message;
        return;
      }
    }
    const path = "/api/runs/" + encodeURIComponent(article.dataset.runId) + "/approvals/" +
                 encodeURIComponent(article.dataset.requestId) + "/" + (verb === "reject" ? "reject" : "approve");
    try {
      await post(path, body);
      error.textContent = "";
      await refreshApprovals(box);
    } catch (err) {
      error.textContent = err.message;
    }
  });
  if (box.dataset.scope === "inbox") {
    const source = new EventSource("/api/events");
    source.onopen = () => live("open");
    source.onerror = () => live("reconnecting");
    source.onmessage = () => soon("approvals", () => refreshApprovals(box));
  }
}

// The attention page is a list of forms: when a run comes to need attention
// or stops needing it, the page is rendered again (unless a form is being
// filled in: then the badge says so and the next change reloads).
function attentionPage(box) {
  const shown = new Set(box.dataset.runIds ? box.dataset.runIds.split("\n") : []);
  const source = new EventSource("/api/events");
  source.onopen = () => live("open");
  source.onerror = () => live("reconnecting");
  source.onmessage = (message) => {
    const run = JSON.parse(message.data).run;
    if (!run || (run.status === "needs_attention") === shown.has(run.run_id)) return;
    const busy = document.activeElement && document.activeElement.closest("form.resolve");
    if (busy) {
      live("changed");
      return;
    }
    source.close();
    window.location.reload();
  };
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
    const message = form.querySelector(".resolve-error");
    let result = null;
    try {
      result = done ? JSON.parse(text) : null;
    } catch (err) {
      message.textContent = "the result is not JSON: " + err.message;
      return;
    }
    const path = "/api/runs/" + encodeURIComponent(form.dataset.runId) + "/operations/" +
                 encodeURIComponent(form.dataset.position) + "/resolve";
    try {
      await post(path, {done: done, result: result});
      window.location.reload();
    } catch (err) {
      message.textContent = err.message;
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
  // signed in already: the user submits the link's token, no page does it for them
  if (!form.dataset.signedIn) form.submit();
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
  const attention = document.getElementById("attention");
  if (attention) attentionPage(attention);
  const asked = document.getElementById("approvals");
  if (asked) approvals(asked);
});
