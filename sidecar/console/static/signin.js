// The console's sign-in: spend the one-time code in this page's fragment for a session secret, keep the
// secret in sessionStorage (this origin's only, port included), and open the console. The code leaves
// the address bar before anything else happens.
"use strict";

(async () => {
  const notice = document.getElementById("notice");
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  history.replaceState(null, "", location.pathname);
  if (!code) {
    notice.textContent = "This sign-in link has no code. Run sidecar ui in a terminal for a new one.";
    return;
  }
  const response = await fetch("/ui/api/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code }),
    cache: "no-store",
  }).catch(() => null);
  const data = response ? await response.json().catch(() => null) : null;
  if (!response || !response.ok || !data || typeof data.secret !== "string") {
    notice.textContent = (data && data.error && data.error.message) || "The daemon did not answer: is it running?";
    return;
  }
  sessionStorage.setItem("sidecar-session", data.secret);
  location.replace("/ui/");
})();
