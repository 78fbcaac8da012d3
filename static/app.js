// budgetscope: small progressive enhancements. Pages work without it; state lives in URLs.
"use strict";
(function () {
  function rows() { return Array.prototype.slice.call(document.querySelectorAll(".wf-row")); }

  function setCollapsed(row, collapsed) {
    var button = row.querySelector("button.tog");
    if (!button) return;
    if (collapsed) row.setAttribute("data-collapsed", ""); else row.removeAttribute("data-collapsed");
    button.setAttribute("aria-expanded", collapsed ? "false" : "true");
    button.textContent = collapsed ? "▸" : "▾";
  }

  // Shows or hides the rows after `start` that lie below it, honouring nested collapsed rows.
  function refresh(all, start) {
    var depth = Number(all[start].dataset.depth);
    var limit = all[start].hasAttribute("data-collapsed") ? depth : Infinity;
    for (var j = start + 1; j < all.length; j++) {
      var d = Number(all[j].dataset.depth);
      if (d <= depth) break;
      if (d > limit) { all[j].hidden = true; continue; }
      all[j].hidden = false;
      limit = all[j].hasAttribute("data-collapsed") ? d : Infinity;
    }
  }

  function setAll(collapsed) {
    var all = rows();
    all.forEach(function (row) { setCollapsed(row, collapsed); });
    all.forEach(function (row) { row.hidden = collapsed && Number(row.dataset.depth) > 0; });
  }

  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) return;
    var toggle = target.closest("button.tog");
    if (toggle) {
      toggleRow(toggle.closest(".wf-row"), !isCollapsed(toggle));
      return;
    }
    if (target.closest("[data-expand-all]")) { setAll(false); return; }
    if (target.closest("[data-collapse-all]")) { setAll(true); return; }
    if (target.closest("[data-back]")) { history.back(); }
  });

  function isCollapsed(button) { return button.getAttribute("aria-expanded") === "false"; }

  // Expands or collapses a row; in big traces the first expand fetches its children.
  function toggleRow(row, collapse) {
    var lazy = row.getAttribute("data-lazy");
    if (!collapse && lazy) {
      var button = row.querySelector("button.tog");
      button.disabled = true;
      fetch(lazy, { headers: { "Accept": "text/html" } })
        .then(function (response) {
          if (!response.ok) throw new Error("the server answered " + response.status);
          return response.text();
        })
        .then(function (html) {
          row.insertAdjacentHTML("afterend", html);
          row.removeAttribute("data-lazy");
          button.disabled = false;
          toggleRow(row, false);
        })
        .catch(function (error) {
          button.disabled = false;
          button.title = "Could not load the children (" + error.message + "); reload the page and retry.";
        });
      return;
    }
    var all = rows();
    setCollapsed(row, collapse);
    refresh(all, all.indexOf(row));
  }

  // Keyboard: on a focused row link, ArrowRight expands and ArrowLeft collapses.
  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (!(target instanceof Element) || event.key !== "ArrowRight" && event.key !== "ArrowLeft") return;
    var row = target.closest(".wf-row");
    if (!row || !row.querySelector("button.tog")) return;
    toggleRow(row, event.key === "ArrowLeft");
    event.preventDefault();
  });

  // Bring the selected row into view when the page opens on one.
  var selected = document.querySelector(".wf-row.sel");
  if (selected && !location.hash) selected.scrollIntoView({ block: "center" });
})();
