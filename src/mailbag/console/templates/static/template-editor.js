// The template editor's live preview: a moment after the operator stops typing, the form
// (its CSRF token included) is posted to the page's `data-live` URL, which renders the
// draft with its sample data and writes nothing; the answer fills the page's sandboxed
// frames (srcdoc, never scripts), subject, text and problems (textContent, never HTML).
// Without this script the Preview button does the same with a page load.
(function () {
  "use strict";
  var form = document.getElementById("editor");
  var section = document.getElementById("preview");
  if (!form || !section || !window.fetch || !window.URLSearchParams || !window.FormData) {
    return;
  }
  var url = form.getAttribute("data-live");
  var byId = function (id) { return document.getElementById(id); };
  var timer = 0;
  var latest = 0; // the number of the newest request: an older answer is dropped

  function status(text) { byId("live-status").textContent = text; }

  function showProblems(problems) {
    var list = byId("problem-list");
    list.textContent = "";
    problems.forEach(function (p) {
      var item = document.createElement("li");
      var where = document.createElement("span");
      where.className = "mono";
      where.textContent = p.part + (p.line === null || p.line === undefined ? "" : " line " + p.line);
      item.appendChild(where);
      item.appendChild(document.createTextNode(": " + p.message));
      list.appendChild(item);
    });
    byId("problems-title").textContent = "The draft cannot be rendered";
    byId("problems").hidden = problems.length === 0;
  }

  function showRendered(answer) {
    byId("preview-subject").textContent = answer.subject;
    byId("preview-uses").textContent = answer.uses.length ? answer.uses.join(", ") : "—";
    byId("preview-text").textContent = answer.text;
    byId("preview-desktop").srcdoc = answer.html;
    byId("preview-narrow").srcdoc = answer.html;
    byId("frames").hidden = !answer.html;
    byId("no-html").hidden = !!answer.html;
    byId("rendered").hidden = false;
  }

  function send() {
    var mine = ++latest;
    status("rendering…");
    fetch(url, {
      method: "POST",
      body: new URLSearchParams(new FormData(form)),
      credentials: "same-origin",
      redirect: "error", // a lapsed session answers with the log-in page: not a preview
      headers: { "Accept": "application/json" }
    }).then(function (response) {
      var json = (response.headers.get("Content-Type") || "").indexOf("application/json") === 0;
      if (response.status === 413 && !json) {
        throw new Error("the form is larger than this deployment takes");
      }
      if (!json) { throw new Error("HTTP " + response.status); }
      return response.json();
    }).then(function (answer) {
      if (mine !== latest) { return; }
      section.hidden = false;
      var rendered = byId("rendered");
      if (answer.problems) {
        showProblems(answer.problems);
        rendered.classList.add("stale"); // the last draft that rendered, dimmed
        status("(live: the draft has problems; below, the last one that rendered)");
      } else {
        showProblems([]);
        showRendered(answer);
        rendered.classList.remove("stale");
        status("(live, as you type)");
      }
    }).catch(function (error) {
      if (mine === latest) {
        status("(live preview stopped: " + error.message + "; reload the page or press Preview)");
      }
    });
  }

  form.addEventListener("input", function () {
    window.clearTimeout(timer);
    timer = window.setTimeout(send, 400);
  });
  status("(live, as you type)");
})();
