// Statusgate operator console: the agent keys page (#/keys), for operators whose role may
// manage keys (admin). Lists keys (never their tokens), makes one and shows its token once,
// revokes one after a second click. Loaded before console.js, which calls the factory with
// its API client and DOM helpers; nothing here runs until then. Text only, never HTML.
"use strict";

window.StatusgateKeys = function (ui) {
  const $ = ui.$;
  let confirming = null; // the id whose revocation waits for a second click

  function quotasText(quotas) {
    const parts = [];
    if (quotas.max_active_operations) parts.push(quotas.max_active_operations + " active");
    if (quotas.submits_per_hour) parts.push(quotas.submits_per_hour + " per hour");
    return parts.length ? parts.join(", ") : "none";
  }

  function revokeCell(key) {
    const box = ui.el("div", "buttons");
    if (confirming === key.id) {
      const yes = ui.el("button", null, "Revoke " + key.id);
      yes.type = "button";
      yes.addEventListener("click", () => revoke(key.id));
      const no = ui.el("button", "quiet", "Keep");
      no.type = "button";
      no.addEventListener("click", () => {
        confirming = null;
        show();
      });
      box.append(ui.el("span", "sub", "Agents using it are refused at once."), yes, no);
    } else {
      const button = ui.el("button", "quiet", "Revoke");
      button.type = "button";
      button.setAttribute("aria-label", "Revoke " + key.id);
      button.addEventListener("click", () => {
        confirming = key.id;
        show().then(() => {
          const yes = document.querySelector("#keys-rows button:not(.quiet)");
          if (yes) yes.focus();
        });
      });
      box.append(button);
    }
    return box;
  }

  function keyRow(key) {
    const row = ui.el("tr");
    const expires = key.expires_at ? ui.instant(key.expires_at) : "never";
    const expiresCell = ui.el("div", "stack");
    expiresCell.append(ui.el("span", null, expires));
    if (key.expired) expiresCell.append(ui.el("span", "badge badge-expired", "expired"));
    const made = ui.el("div", "stack");
    made.append(ui.el("span", null, ui.instant(key.created_at)), ui.el("span", "sub", "by " + key.created_by));
    row.append(
      ui.cell("Key", ui.el("code", null, key.id), "cell-op"),
      ui.cell("Account", key.account, "nowrap"),
      ui.cell("Providers", key.providers.join(", ")),
      ui.cell("Expires", expiresCell, "nowrap"),
      ui.cell("Quotas", quotasText(key.quotas)),
      ui.cell("Made", made, "nowrap"),
      ui.cell("Revoke", revokeCell(key)),
    );
    return row;
  }

  async function show() {
    try {
      const data = await ui.api("/admin/keys");
      const count = data.keys.length;
      $("keys-summary").textContent = count === 0 ? "No agent keys yet."
        : count === 1 ? "1 agent key." : count + " agent keys, oldest first.";
      $("keys-table").hidden = count === 0;
      $("keys-rows").replaceChildren(...data.keys.map(keyRow));
    } catch (error) {
      ui.failed(error, "Keys not loaded");
    }
  }

  function numberOrNull(id) {
    const text = $(id).value.trim();
    return text === "" ? null : Number(text);
  }

  async function make(event) {
    event.preventDefault();
    $("key-error").hidden = true;
    const body = {
      account: $("k-account").value.trim(),
      providers: $("k-providers").value.split(",").map((p) => p.trim()).filter(Boolean),
      quotas: {
        max_active_operations: numberOrNull("k-active"),
        submits_per_hour: numberOrNull("k-hourly"),
      },
    };
    const expires = $("k-expires").value.trim();
    if (expires) body.expires_at = expires;
    $("key-make").disabled = true;
    try {
      const made = await ui.api("/admin/keys", "POST", body);
      $("key-made-id").textContent = made.id;
      $("key-made-account").textContent = made.account;
      $("key-token").textContent = made.token;
      $("key-made").hidden = false;
      $("key-form").reset();
      $("key-made").focus();
      await show();
    } catch (error) {
      if (error.status === 400) {
        $("key-error").textContent = error.message;
        $("key-error").hidden = false;
      } else {
        ui.failed(error, "Key not made");
      }
    } finally {
      $("key-make").disabled = false;
    }
  }

  async function revoke(id) {
    confirming = null;
    try {
      await ui.api("/admin/keys/" + encodeURIComponent(id), "DELETE");
      ui.notice("");
      $("keys-summary").textContent = "Revoked " + id + ".";
    } catch (error) {
      ui.failed(error, "Key not revoked");
    }
    await show();
    $("keys-title").focus();
  }

  // The token leaves the page when the operator is done with it, or signs out (which
  // also clears the form).
  function forget() {
    $("key-token").textContent = "";
    $("key-made").hidden = true;
  }

  function reset() {
    forget();
    confirming = null;
    $("key-form").reset();
    $("key-error").hidden = true;
  }

  $("key-form").addEventListener("submit", make);
  $("key-done").addEventListener("click", forget);
  $("key-copy").addEventListener("click", () => {
    if (navigator.clipboard) navigator.clipboard.writeText($("key-token").textContent);
  });

  return { show, forget, reset };
};
