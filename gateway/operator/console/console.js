// Statusgate operator console: a small client of the operator API under /admin.
// The token lives in sessionStorage and goes out only as "Authorization: Bearer" on fetch
// calls to this gateway (no cookies). Everything shown is set as text, never as HTML.
// With single sign-on (oidc in the gateway config) the token is the issuer's ID token, got
// by the authorization-code flow with PKCE: this page makes the verifier, the state and the
// nonce, the issuer sends the code back to /console, and the gateway redeems it.
"use strict";

(function () {
  const TOKEN_KEY = "statusgate.operatorToken";
  const SSO_KEY = "statusgate.signIn"; // one sign-in at the issuer in flight: state, verifier
  const REFRESH_MS = 3000;
  const ACTIONS = {
    extend: {
      label: "Extend",
      path: "extend",
      explain: "Adds time and status requests within the policy's bounds; the gateway " +
        "polls the provider again at once.",
      done: "Extended: the operation is waiting again.",
    },
    cancel_at_provider: {
      label: "Cancel at provider",
      path: "cancel",
      explain: "Asks the provider to cancel the job. The operation then waits, on a small " +
        "budget, for the provider's final state.",
      done: "The provider accepted the cancel request; waiting for its final state.",
    },
    abandon: {
      label: "Abandon",
      path: "abandon",
      explain: "Stops waiting for good: agents get operation-escalated (abandoned) from now " +
        "on. This cannot be undone.",
      done: "Abandoned: the gateway no longer waits for this job.",
    },
    resume: {
      label: "Resume",
      path: "resume",
      explain: "Polls again under the current policy and credential; refused unless what " +
        "caused the escalation changed since.",
      done: "Resumed: the operation is waiting again.",
    },
  };

  const $ = (id) => document.getElementById(id);
  const VIEWS = ["queue-view", "operations-view", "operation-view", "keys-view"];
  let token = null;
  let me = null; // GET /admin/me: id, role, via, may
  let sso = null; // GET /console/oidc/config
  let timer = null;
  let refreshing = false;
  let queueIds = "";
  let current = null; // the operation shown: the show endpoint's answer
  let chosen = null; // the action whose form is open
  let opener = null; // the button that opened it: focus goes back there on Close
  let seq = 0; // loads of the list or an operation: only the latest one renders
  const pages = { key: "", cursors: [null], index: 0 };

  class ApiError extends Error {
    constructor(status, detail, type) {
      super(detail);
      this.status = status;
      this.type = type || "";
    }
  }

  // -- the operator API ----------------------------------------------------------------
  async function api(path, method, body) {
    const headers = { Accept: "application/json", Authorization: "Bearer " + token };
    const init = { method: method || "GET", headers, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new ApiError(0, "The gateway did not answer. Is this page open on its admin listener?");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (error) {
      data = null;
    }
    if (!response.ok) {
      const detail = data && typeof data.detail === "string" ? data.detail : response.statusText;
      const type = data && typeof data.type === "string" ? data.type : "";
      throw new ApiError(response.status, detail || "HTTP " + response.status, type);
    }
    return data;
  }

  // A refusal that ends the session; null for any other error (a forbidden-role refusal
  // leaves the operator signed in: they may still read).
  function refusal(error) {
    if (error.status === 401 && me && me.via === "oidc") {
      return "Your single sign-on has ended (" + error.message.replace(/\.$/, "") + "). " +
        "Sign in with SSO again.";
    }
    if (error.status === 401) {
      return "Sign-in refused: this is not an operator token of this gateway. " +
        "Check the token and try again.";
    }
    if (error.status === 403 && error.type !== "/problems/forbidden-role") {
      return "Sign-in refused: this is an agent token. Agent tokens cannot use the " +
        "operator console; sign in with an operator token.";
    }
    return null;
  }

  // -- small DOM helpers ---------------------------------------------------------------
  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function cell(label, content, className) {
    const td = el("td", className);
    td.dataset.label = label;
    if (content instanceof Node) td.append(content);
    else td.textContent = content === null || content === undefined ? "—" : String(content);
    return td;
  }

  function operationLink(id) {
    const link = el("a", "op-link", id);
    link.href = "#/operation/" + encodeURIComponent(id);
    return link;
  }

  function badge(text, kind) {
    return el("span", "badge badge-" + (kind || text || "none"), text || "—");
  }

  function instant(text) {
    if (!text) return "—";
    return text.replace("T", " ").replace(/(\.\d+)?Z$/, " UTC");
  }

  function age(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min";
    const h = Math.floor(m / 60);
    if (h < 48) return h + " h " + (m % 60) + " min";
    return Math.floor(h / 24) + " d " + (h % 24) + " h";
  }

  function setText(id, text) {
    const node = $(id);
    if (node.textContent !== text) node.textContent = text;
  }

  function notice(text) {
    const node = $("notice");
    node.textContent = text || "";
    node.hidden = !text;
  }

  // -- signing in and out ----------------------------------------------------------------
  function showSignedOut(message) {
    token = null;
    me = null;
    sessionStorage.removeItem(TOKEN_KEY);
    setText("who", "");
    if (timer !== null) clearInterval(timer);
    timer = null;
    queueIds = "";
    current = null;
    for (const id of VIEWS) $(id).hidden = true;
    $("nav").hidden = true;
    $("nav-keys").hidden = true;
    if (keys) keys.reset();
    $("keys-rows").replaceChildren();
    $("queue-rows").replaceChildren();
    $("operations-rows").replaceChildren();
    $("op-record").replaceChildren();
    $("op-story").replaceChildren();
    $("op-actions").replaceChildren();
    setText("queue-count", "");
    document.title = "Statusgate operator console";
    $("sign-in").hidden = false;
    notice(message);
    $("token").focus();
  }

  async function signIn(candidate, viaSso) {
    token = candidate;
    $("sign-in-button").disabled = true;
    try {
      me = await api("/admin/me");
      const queue = await api("/admin/escalations?limit=200");
      sessionStorage.setItem(TOKEN_KEY, candidate);
      setText("who", me.id + " (" + me.role + ")");
      $("who").title = "Signed in " + (me.via === "oidc" ? "with single sign-on" : "with a token") +
        " as " + me.id + ", role " + me.role;
      $("token").value = "";
      $("sign-in").hidden = true;
      $("nav").hidden = false;
      $("nav-keys").hidden = !(me.may && me.may.keys);
      notice("");
      renderQueue(queue);
      timer = setInterval(refreshQueue, REFRESH_MS);
      await route(true);
    } catch (error) {
      const why = viaSso ? "Single sign-on failed: " + error.message : refusal(error);
      showSignedOut(why || "Sign-in failed: " + error.message);
    } finally {
      $("sign-in-button").disabled = false;
    }
  }

  // Any later 401/403 (token removed from the config, say) ends the session.
  function failed(error, where) {
    const refused = refusal(error);
    if (refused) {
      showSignedOut(refused);
      return;
    }
    notice(where + ": " + error.message);
  }

  // -- the escalation queue ---------------------------------------------------------------
  async function refreshQueue() {
    if (refreshing || token === null) return;
    refreshing = true;
    try {
      renderQueue(await api("/admin/escalations?limit=200"));
      if ($("notice").textContent.startsWith("Queue")) notice("");
    } catch (error) {
      failed(error, "Queue not refreshed");
    } finally {
      refreshing = false;
    }
  }

  function renderQueue(data) {
    const items = data.escalations;
    const total = data.total;
    setText("queue-count", total ? String(total) : "");
    document.title = (total ? "(" + total + ") " : "") + "Statusgate operator console";
    setText("queue-updated", "Updated " + instant(data.now) + "; refreshes every " +
      REFRESH_MS / 1000 + " s");
    let summary = "No escalations are waiting.";
    if (total === 1) summary = "1 operation waits for a decision.";
    else if (total > 1) summary = total + " operations wait for a decision, oldest first.";
    if (total > items.length) summary += " Showing the oldest " + items.length + ".";
    setText("queue-summary", summary);
    $("queue-table").hidden = items.length === 0;
    const ids = items.map((item) => item.operation_id).join(" ");
    const body = $("queue-rows");
    if (ids === queueIds) {
      // Same rows in the same order: update ages and text in place, so keyboard focus on
      // a link survives the refresh.
      // An open message stays open.
      items.forEach((item, index) => {
        const row = body.rows[index];
        const ageCell = row.cells[4];
        if (ageCell.textContent !== age(item.age_seconds)) ageCell.textContent = age(item.age_seconds);
        const why = row.cells[3].querySelector(".sub");
        if (why.textContent !== detailOf(item.message)) why.textContent = detailOf(item.message);
        const pre = row.cells[5].querySelector("pre");
        if (pre.textContent !== item.message) pre.textContent = item.message;
      });
      return;
    }
    queueIds = ids;
    body.replaceChildren(...items.map(queueRow));
  }

  // The escalation message's "Detail:" line: the concrete cause, in one line.
  function detailOf(message) {
    const found = /^Detail: (.*)$/m.exec(message || "");
    return found ? found[1] : "";
  }

  // One compact row per escalation; the whole message only on demand.
  function queueRow(item) {
    const row = el("tr");
    const first = el("div", "stack");
    first.append(operationLink(item.operation_id), el("span", "sub", "job " + item.provider_job_id));
    const ageCell = cell("Age", age(item.age_seconds), "nowrap cell-age");
    ageCell.title = "Escalated at " + instant(item.escalated_at);
    const reason = el("div", "stack");
    reason.append(badge(item.reason, "reason"), el("span", "sub", detailOf(item.message)));
    const more = el("details", "more");
    more.append(el("summary", null, "Message"), el("pre", "message", item.message));
    row.append(
      cell("Operation", first, "cell-op"),
      cell("Provider", item.provider, "nowrap cell-provider"),
      cell("Account", item.account, "nowrap cell-account"),
      cell("Reason", reason, "cell-reason"),
      ageCell,
      cell("Message", more, "cell-message"),
    );
    return row;
  }

  // -- all operations -----------------------------------------------------------------------
  function filtersFromHash(query) {
    const params = new URLSearchParams(query);
    return {
      outcome: params.get("outcome") || "",
      provider: params.get("provider") || "",
      account: params.get("account") || "",
      limit: params.get("limit") || "25",
    };
  }

  function filtersHash(filters) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(filters)) {
      if (value && !(name === "limit" && value === "25")) params.set(name, value);
    }
    const text = params.toString();
    return "#/operations" + (text ? "?" + text : "");
  }

  async function showOperations(query) {
    const filters = filtersFromHash(query);
    $("f-outcome").value = filters.outcome;
    $("f-provider").value = filters.provider;
    $("f-account").value = filters.account;
    $("f-limit").value = ["10", "25", "50", "100"].includes(filters.limit) ? filters.limit : "25";
    const key = JSON.stringify(filters);
    if (pages.key !== key) {
      pages.key = key;
      pages.cursors = [null];
      pages.index = 0;
    }
    await loadOperations(filters);
  }

  async function loadOperations(filters) {
    const params = new URLSearchParams();
    for (const name of ["outcome", "provider", "account"]) {
      if (filters[name]) params.set(name, filters[name]);
    }
    params.set("limit", ["10", "25", "50", "100"].includes(filters.limit) ? filters.limit : "25");
    const cursor = pages.cursors[pages.index];
    if (cursor) params.set("cursor", cursor);
    const mine = ++seq;
    let data;
    try {
      data = await api("/admin/operations?" + params.toString());
    } catch (error) {
      if (mine === seq) failed(error, "Operations not loaded");
      return;
    }
    if (mine !== seq) return;
    notice("");
    pages.cursors[pages.index + 1] = data.next_cursor;
    pages.cursors.length = pages.index + 2;
    const rows = data.operations.map(operationRow);
    $("operations-rows").replaceChildren(...rows);
    $("operations-table").hidden = rows.length === 0;
    const shown = rows.length === 1 ? "1 operation" : rows.length + " operations";
    setText("operations-summary", rows.length ? shown + " on this page." : "No operations match.");
    setText("page-number", "Page " + (pages.index + 1));
    $("page-first").disabled = pages.index === 0;
    $("page-prev").disabled = pages.index === 0;
    $("page-next").disabled = !data.next_cursor;
  }

  function operationRow(record) {
    const row = el("tr");
    row.append(
      cell("Operation", operationLink(record.operation_id)),
      cell("Provider", record.provider, "nowrap"),
      cell("Account", record.account, "nowrap"),
      cell("Outcome", badge(record.outcome)),
      cell("Started", instant(record.started_at), "nowrap"),
      cell("Status requests", record.status_requests_used + " of " + record.max_status_requests),
      cell("Provider job", record.provider_job_id, "mono"),
    );
    return row;
  }

  function page(step) {
    if (step === 0) pages.index = 0;
    else pages.index = Math.max(0, pages.index + step);
    loadOperations(filtersFromHash(location.hash.split("?")[1] || ""));
  }

  // -- one operation ------------------------------------------------------------------------
  async function showOperation(id, keepResult) {
    const mine = ++seq;
    let data;
    try {
      data = await api("/admin/operations/" + encodeURIComponent(id));
    } catch (error) {
      if (mine !== seq) return false;
      if (error.status === 404) {
        current = null;
        $("operation-view").hidden = true;
        notice("No operation " + id + " is known to this gateway.");
        return false;
      }
      failed(error, "Operation not loaded");
      return false;
    }
    if (mine !== seq) return false;
    notice("");
    current = data;
    renderOperation(data, keepResult);
    return true;
  }

  function renderOperation(data, keepResult) {
    const record = data.record;
    setText("op-id", record.operation_id);
    const line = $("op-outcome-line");
    line.replaceChildren(badge(record.outcome), document.createTextNode(
      " " + record.provider + " job " + record.provider_job_id + " for account " + record.account));
    renderRecord(record);
    renderStory(data.story || []);
    renderDecision(data);
    closeAction();
    if (!keepResult) $("action-result").hidden = true;
  }

  function renderRecord(record) {
    const used = record.status_requests_used;
    const budget = record.max_status_requests;
    const bar = $("op-budget");
    bar.max = Math.max(1, budget);
    bar.value = Math.min(used, bar.max);
    bar.classList.toggle("spent", used >= budget);
    setText("op-budget-text", used + " of " + budget + " status requests used");
    const facts = [
      ["Outcome", record.outcome],
      ["Provider", record.provider],
      ["Account", record.account],
      ["Provider job", record.provider_job_id],
      ["Last known state", record.last_known_state],
      ["Last HTTP status", record.last_http_status],
      ["Started", instant(record.started_at)],
      ["Deadline", instant(record.deadline_at)],
      ["Next poll", record.outcome === "pending" ? instant(record.next_poll_at) : null],
      ["Next delay from", record.delay_source],
      ["Last polled", instant(record.last_polled_at)],
      ["Transport failures", record.transport_failures_used + " of " + record.max_transport_failures],
      ["Rate limited", record.rate_limited_used + " of " + record.max_rate_limited],
      ["Early calls refused", record.early_refusals],
      ["Extended so far", record.extended_seconds || record.extended_requests
        ? formatSeconds(record.extended_seconds) + " and " + record.extended_requests + " requests"
        : "not yet"],
      ["Cancel requested", record.cancel_requested_at ? instant(record.cancel_requested_at) : null],
      ["Stopped waiting", record.ended_at ? instant(record.ended_at) : null],
      ["Usage", usageText(record.usage)],
    ];
    const list = $("op-record");
    list.replaceChildren();
    for (const [name, value] of facts) {
      if (value === null || value === undefined || value === "—") continue;
      list.append(el("dt", null, name), el("dd", null, value));
    }
  }

  // SPEC 23: the numbers the final answer reported, as "input_tokens 1200, pages 3"
  function usageText(usage) {
    const kinds = Object.keys(usage || {}).sort();
    if (kinds.length === 0) return null;
    return kinds.map((kind) => kind + " " + usage[kind]).join(", ");
  }

  function formatSeconds(seconds) {
    if (!seconds) return "0 s";
    if (seconds % 3600 === 0) return seconds / 3600 + " h";
    if (seconds % 60 === 0) return seconds / 60 + " min";
    return seconds + " s";
  }

  function renderStory(lines) {
    const list = $("op-story");
    list.replaceChildren(...lines.map((line) => {
      const item = el("li");
      const space = line.indexOf(" ");
      item.append(el("span", "when", space > 0 ? line.slice(0, space) : ""),
        el("span", "what", space > 0 ? line.slice(space + 1) : line));
      return item;
    }));
    $("op-story-empty").hidden = lines.length > 0;
  }

  function renderDecision(data) {
    const escalation = data.escalation;
    const record = data.record;
    const buttons = $("op-actions");
    buttons.replaceChildren();
    const waiting = record.outcome === "escalated" && escalation;
    $("op-escalation").hidden = !waiting;
    $("op-no-decision").hidden = Boolean(waiting);
    if (!waiting) {
      $("op-role-note").hidden = true;
      setText("op-no-decision", "No decision is waiting: the operation is " + record.outcome + ".");
      return;
    }
    $("op-reason").replaceChildren(badge(escalation.reason, "reason"));
    setText("op-detail", detailOf(data.message) || "—");
    setText("op-escalated-at", instant(escalation.escalated_at));
    setText("op-message", data.message || "");
    const left = data.extension_left;
    setText("op-bounds", left
      ? "The policy allows extensions of " + left.max_time + " and " + left.max_requests +
        " requests in total; " + left.time + " and " + left.requests + " requests are left."
      : "");
    $("op-bounds").hidden = !left;
    // Only what can succeed now: the gateway leaves out a resume nothing has changed for.
    const offered = escalation.permitted_actions;
    const mayDecide = Boolean(me && me.may && me.may.decide);
    $("op-role-note").hidden = mayDecide;
    if (!mayDecide) {
      // The API refuses a viewer's decision (403 forbidden-role); the page offers none.
      setText("op-role-note", "You are signed in as " + (me ? me.id : "?") + " with the role " +
        (me ? me.role : "?") + ": you can read this escalation, but deciding it needs a " +
        "decider or an admin. A decider could now: " + offered.map(actionLabel).join(", ") + ".");
      $("op-bounds").hidden = true;
      return;
    }
    if (!offered.length) setText("op-bounds", "No action can succeed now.");
    $("op-bounds").hidden = !left && offered.length > 0;
    for (const action of offered) {
      const known = ACTIONS[action];
      if (!known) continue;
      const button = el("button", action === "abandon" ? "danger" : null, known.label);
      button.type = "button";
      button.dataset.action = action;
      button.setAttribute("aria-controls", "action-form");
      button.addEventListener("click", () => openAction(action, button));
      buttons.append(button);
    }
  }

  function actionLabel(action) {
    return ACTIONS[action] ? ACTIONS[action].label : action;
  }

  function openAction(action, button) {
    const known = ACTIONS[action];
    chosen = action;
    opener = button;
    for (const other of $("op-actions").children) {
      other.setAttribute("aria-expanded", String(other === button));
    }
    setText("action-title", known.label);
    setText("action-explain", known.explain);
    const extend = action === "extend";
    $("extend-fields").hidden = !extend;
    const left = current && current.extension_left;
    $("a-time").value = "";
    $("a-requests").value = "";
    if (left) {
      $("a-requests").max = String(left.requests);
      setText("a-time-hint", "A duration like 15m or 1h; at most " + left.time + ".");
      setText("a-requests-hint", "Extra status requests; at most " + left.requests + ".");
    } else {
      $("a-requests").removeAttribute("max");
      setText("a-time-hint", "A duration like 15m or 1h.");
      setText("a-requests-hint", "Extra status requests.");
    }
    $("a-reason").value = "";
    $("action-error").hidden = true;
    $("action-result").hidden = true;
    $("action-form").hidden = false;
    (extend ? $("a-time") : $("a-reason")).focus();
  }

  function closeAction(returnFocus) {
    chosen = null;
    $("action-form").hidden = true;
    for (const other of $("op-actions").children) other.setAttribute("aria-expanded", "false");
    if (returnFocus === true && opener && opener.isConnected) opener.focus();
    opener = null;
  }

  function actionError(text) {
    const node = $("action-error");
    node.textContent = text;
    node.hidden = false;
  }

  async function confirmAction(event) {
    event.preventDefault();
    if (!chosen || !current) return;
    const known = ACTIONS[chosen];
    const reason = $("a-reason").value.trim();
    if (!reason) {
      actionError("Give a reason: it goes into the audit log.");
      $("a-reason").focus();
      return;
    }
    const body = { reason };
    if (chosen === "extend") {
      const time = $("a-time").value.trim();
      const requests = $("a-requests").value.trim();
      if (!time && !requests) {
        actionError("Give a time, a number of requests, or both.");
        $("a-time").focus();
        return;
      }
      if (requests && !/^\d+$/.test(requests)) {
        actionError("Requests must be a whole number.");
        $("a-requests").focus();
        return;
      }
      if (time) body.time = time;
      body.requests = requests ? Number(requests) : 0;
    }
    const id = current.record.operation_id;
    $("action-confirm").disabled = true;
    try {
      const answer = await api(
        "/admin/operations/" + encodeURIComponent(id) + "/" + known.path, "POST", body);
      const result = $("action-result");
      result.className = "result ok";
      result.textContent = known.done + " Outcome now: " + answer.record.outcome + "; " +
        answer.record.status_requests_used + " of " + answer.record.max_status_requests +
        " status requests used; deadline " + instant(answer.record.deadline_at) + ".";
      result.hidden = false;
      await showOperation(id, true);
      result.focus();
      refreshQueue();
    } catch (error) {
      if (refusal(error)) {
        failed(error, "");
        return;
      }
      // The API's detail may already say so ("Refused: the policy has not changed since.").
      actionError(/^refused\b/i.test(error.message) ? error.message : "Refused: " + error.message);
    } finally {
      $("action-confirm").disabled = false;
    }
  }

  // -- single sign-on (authorization code with PKCE) -----------------------------------------
  function randomText(bytes) {
    const buffer = new Uint8Array(bytes);
    crypto.getRandomValues(buffer);
    return base64url(buffer);
  }

  function base64url(bytes) {
    let text = "";
    for (const byte of new Uint8Array(bytes)) text += String.fromCharCode(byte);
    return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  async function loadSso() {
    try {
      const response = await fetch("/console/oidc/config", { credentials: "omit", cache: "no-store" });
      sso = response.ok ? await response.json() : null;
    } catch (error) {
      sso = null;
    }
    const on = Boolean(sso && sso.enabled);
    $("sso-button").hidden = !on;
    $("sso-hint").hidden = !on;
  }

  async function startSso() {
    if (!sso || !sso.enabled) return;
    if (sso.error) {
      notice(sso.error);
      await loadSso(); // it may answer now
      return;
    }
    if (!window.crypto || !crypto.subtle) {
      notice("Single sign-on needs this console served over HTTPS (or on localhost): the browser " +
        "offers no Web Crypto to make the PKCE challenge here.");
      return;
    }
    const attempt = {
      state: randomText(16),
      verifier: randomText(32),
      nonce: randomText(16),
      redirect: location.origin + "/console",
      hash: location.hash.startsWith("#/") ? location.hash : "",
    };
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(attempt.verifier));
    const url = new URL(sso.authorization_endpoint);
    const query = {
      response_type: "code",
      client_id: sso.client_id,
      redirect_uri: attempt.redirect,
      scope: sso.scope,
      state: attempt.state,
      nonce: attempt.nonce,
      code_challenge: base64url(digest),
      code_challenge_method: "S256",
    };
    for (const [name, value] of Object.entries(query)) url.searchParams.set(name, value);
    sessionStorage.setItem(SSO_KEY, JSON.stringify(attempt));
    location.assign(url.toString());
  }

  // Back from the issuer with ?code=&state= (or ?error=): redeem the code once, at once.
  async function finishSso(params) {
    let attempt = null;
    try {
      attempt = JSON.parse(sessionStorage.getItem(SSO_KEY) || "null");
    } catch (error) {
      attempt = null;
    }
    sessionStorage.removeItem(SSO_KEY);
    history.replaceState(null, "", "/console" + ((attempt && attempt.hash) || ""));
    if (params.get("error")) {
      const why = params.get("error_description") || params.get("error");
      showSignedOut("Single sign-on was not completed: " + why + ".");
      return;
    }
    if (!attempt || attempt.state !== params.get("state")) {
      showSignedOut("Single sign-on failed: the answer does not belong to a sign-in started " +
        "in this tab. Try again.");
      return;
    }
    $("sign-in").hidden = true;
    notice("Signing in…");
    let data = null;
    try {
      const response = await fetch("/console/oidc/token", {
        method: "POST",
        credentials: "omit",
        cache: "no-store",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({
          code: params.get("code"),
          code_verifier: attempt.verifier,
          redirect_uri: attempt.redirect,
          nonce: attempt.nonce,
        }),
      });
      data = await response.json();
      if (!response.ok) throw new ApiError(response.status, data.detail || "HTTP " + response.status);
    } catch (error) {
      showSignedOut(error instanceof ApiError ? error.message
        : "Single sign-on failed: the gateway did not answer.");
      return;
    }
    await signIn(data.token, true);
  }

  // -- routing -------------------------------------------------------------------------------
  async function route(focusHeading) {
    if (token === null) return;
    const hash = location.hash.startsWith("#/") ? location.hash : "#/queue";
    const [path, query] = hash.slice(1).split("?");
    let view = "queue-view";
    let heading = "queue-title";
    if (path.startsWith("/operation/")) {
      view = "operation-view";
      heading = "op-title";
    } else if (path === "/operations") {
      view = "operations-view";
      heading = "operations-title";
    } else if (path === "/keys" && keys && me.may && me.may.keys) {
      view = "keys-view";
      heading = "keys-title";
    }
    for (const id of VIEWS) $(id).hidden = id !== view;
    $("nav-queue").setAttribute("aria-current", view === "queue-view" ? "page" : "false");
    $("nav-operations").setAttribute("aria-current", view === "operations-view" ? "page" : "false");
    $("nav-keys").setAttribute("aria-current", view === "keys-view" ? "page" : "false");
    if (view === "operation-view") {
      const id = decodeURIComponent(path.slice("/operation/".length));
      if (!(await showOperation(id, false))) return;
    } else if (view === "operations-view") {
      await showOperations(query || "");
    } else if (view === "keys-view") {
      await keys.show();
    } else {
      refreshQueue();
    }
    if (focusHeading) $(heading).focus();
  }

  // -- wiring ------------------------------------------------------------------------------
  async function start() {
    $("sign-in-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const candidate = $("token").value.trim();
      if (!candidate) {
        notice("Paste an operator token first.");
        $("token").focus();
        return;
      }
      signIn(candidate);
    });
    $("sign-out").addEventListener("click", () => showSignedOut("Signed out."));
    $("sso-button").addEventListener("click", startSso);
    $("filters").addEventListener("submit", (event) => {
      event.preventDefault();
      const target = filtersHash({
        outcome: $("f-outcome").value,
        provider: $("f-provider").value.trim(),
        account: $("f-account").value.trim(),
        limit: $("f-limit").value,
      });
      if (location.hash === target) showOperations(target.split("?")[1] || "");
      else location.hash = target;
    });
    $("f-clear").addEventListener("click", () => {
      location.hash = "#/operations";
    });
    $("page-first").addEventListener("click", () => page(0));
    $("page-prev").addEventListener("click", () => page(-1));
    $("page-next").addEventListener("click", () => page(1));
    $("action-form").addEventListener("submit", confirmAction);
    $("action-close").addEventListener("click", () => closeAction(true));
    $("action-form").addEventListener("keydown", (event) => {
      if (event.key === "Escape") closeAction(true);
    });
    window.addEventListener("hashchange", () => {
      if (location.hash.startsWith("#/")) route(true);
    });
    const params = new URLSearchParams(location.search);
    const back = params.has("code") || params.has("error");
    const saved = sessionStorage.getItem(TOKEN_KEY);
    await loadSso();
    if (back) await finishSso(params);
    else if (saved) await signIn(saved);
    else showSignedOut("");
  }

  // the keys page (keys.js, loaded first), given this page's API client and helpers
  const keys = window.StatusgateKeys
    ? window.StatusgateKeys({ $, api, failed, el, cell, instant, notice })
    : null;
  start();
})();
