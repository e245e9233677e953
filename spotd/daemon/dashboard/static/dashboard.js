// spotd's dashboard: keeps each part of a page marked data-refresh up to date by
// asking the daemon for that part again (data-every seconds) and swapping it in.
// A 401 means the session ended: back to the login page, then here again.
"use strict";

// 24-hour time in the zone the daemon shows every time in (<body data-zone>), never
// the browser's own, so the page's times and this one can be compared.
function clockTime(now) {
  const zone = document.body.dataset.zone || "UTC";
  try {
    return now.toLocaleTimeString("en-GB", { timeZone: zone, hour12: false });
  } catch (e) {
    return now.toISOString().slice(11, 19) + "Z";
  }
}

function showLive(ok) {
  const live = document.getElementById("live");
  if (!live) return;
  live.textContent = ok ? "live, " + clockTime(new Date()) : "daemon not answering";
  live.className = ok ? "live" : "live down";
}

function follow(part) {
  const every = 1000 * (parseFloat(part.dataset.every) || 2);
  let shown = null;
  let busy = false;
  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const answer = await fetch(part.dataset.refresh, {
        credentials: "same-origin", cache: "no-store", headers: { Accept: "text/html" },
      });
      if (answer.status === 401) {
        const here = location.pathname + location.search;
        location.assign("/dashboard/login?next=" + encodeURIComponent(here));
        return;
      }
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const html = await answer.text();
      if (html !== shown) {  // unchanged: leave the page (and a reader's selection) alone
        part.innerHTML = html;
        shown = html;
      }
      showLive(true);
    } catch (error) {
      showLive(false);
    } finally {
      busy = false;
    }
  }
  setInterval(refresh, every);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(follow);
});
