// Operators table: sort, filter and paginate rows kept as JSON, so a run with
// thousands of operator signatures stays responsive. Cells are filled with
// textContent only: nothing from the scan is ever parsed as HTML.
(function () {
  "use strict";
  var dataNode = document.getElementById("op-data");
  var table = document.getElementById("ops");
  if (!dataNode || !table) { return; }
  var payload = JSON.parse(dataNode.textContent);
  var columns = payload.columns;
  var rows = payload.rows;
  var col = {};
  columns.forEach(function (c, i) { col[c.key] = i; });

  var details = payload.details || [];
  var state = { text: "", verdict: "", showNa: false, sortKey: null, sortDir: 1, page: 0, pageSize: 25 };
  var body = table.tBodies[0];
  var textInput = document.getElementById("op-filter");
  var verdictSelect = document.getElementById("op-verdict");
  var pageSizeSelect = document.getElementById("op-page-size");
  var counter = document.getElementById("op-count");
  var prev = document.getElementById("op-prev");
  var next = document.getElementById("op-next");
  var showNa = document.getElementById("op-show-na");
  var blocking = { "cpu-fallback": 1, "unsupported": 1, "unknown": 1 };

  var searchable = rows.map(function (r) {
    return columns.map(function (c, i) { return c.search ? String(r[i]) : ""; }).join("\u0001").toLowerCase();
  });

  function matches(index) {
    var r = rows[index];
    var v = r[col.verdict];
    // not-applicable rows (host-only set-up, backend-private kernels) only when asked for
    if (v === "not-applicable" && !state.showNa && state.verdict !== "not-applicable") { return false; }
    if (state.verdict === "blocking") { if (!blocking[v]) { return false; } }
    else if (state.verdict && v !== state.verdict) { return false; }
    return !state.text || searchable[index].indexOf(state.text) !== -1;
  }

  function visibleIndexes() {
    var out = [];
    for (var i = 0; i < rows.length; i++) { if (matches(i)) { out.push(i); } }
    if (state.sortKey !== null) {
      var k = col[state.sortKey], numeric = columns[k].numeric, dir = state.sortDir;
      out.sort(function (a, b) {
        var x = rows[a][k], y = rows[b][k];
        if (numeric) { return dir * ((x || 0) - (y || 0)) || a - b; }
        return dir * String(x).localeCompare(String(y)) || a - b;
      });
    }
    return out;
  }

  function cell(tr, column, value, index) {
    var td = document.createElement("td");
    if (column.key === "evidence" && details[index]) {
      var more = document.createElement("details");
      var summary = document.createElement("summary");
      summary.textContent = value;
      var full = document.createElement("div");
      full.className = "muted";
      full.textContent = details[index];
      var verdict = rows[index][col.verdict];
      if (document.getElementById("g-" + verdict)) {   // what the verdict means: the report's glossary
        var meaning = document.createElement("a");
        meaning.href = "#g-" + verdict;
        meaning.className = "glossary-link";
        meaning.textContent = "what \u201c" + verdict + "\u201d means";
        full.appendChild(document.createTextNode(" "));
        full.appendChild(meaning);
      }
      more.appendChild(summary);
      more.appendChild(full);
      td.appendChild(more);
    } else if (column.key === "verdict") {
      var badge = document.createElement("a");
      badge.className = "badge v-" + value;
      badge.href = "#g-" + value;
      badge.title = "what \u201c" + value + "\u201d means";
      badge.textContent = value;
      td.appendChild(badge);
    } else if (column.key === "share") {
      td.textContent = (value * 100).toFixed(1) + "%";
    } else if (column.key === "time_ms" || column.key === "host_ms") {
      td.textContent = value.toFixed(3);
    } else {
      td.textContent = value;
      if (String(value).length > 60) { td.title = value; }
    }
    td.className = column.cls || "";
    tr.appendChild(td);
  }

  function render() {
    var indexes = visibleIndexes();
    var pages = Math.max(1, Math.ceil(indexes.length / state.pageSize));
    state.page = Math.min(state.page, pages - 1);
    var start = state.page * state.pageSize;
    var slice = indexes.slice(start, start + state.pageSize);
    var fragment = document.createDocumentFragment();
    slice.forEach(function (i) {
      var tr = document.createElement("tr");
      tr.dataset.verdict = rows[i][col.verdict];
      columns.forEach(function (c, k) { cell(tr, c, rows[i][k], i); });
      fragment.appendChild(tr);
    });
    body.replaceChildren(fragment);
    counter.textContent = indexes.length
      ? "Rows " + (start + 1) + "\u2013" + (start + slice.length) + " of " + indexes.length +
        (indexes.length !== rows.length ? " (filtered from " + rows.length +
          (state.showNa || state.verdict === "not-applicable" ? "" : "; not-applicable hidden") + ")" : "") +
        " \u00b7 page " + (state.page + 1) + " of " + pages
      : "No operator matches the filter (" + rows.length + " in total).";
    prev.disabled = state.page === 0;
    next.disabled = state.page >= pages - 1;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.classList.remove("sorted-asc", "sorted-desc");
      if (th.dataset.key === state.sortKey) { th.classList.add(state.sortDir > 0 ? "sorted-asc" : "sorted-desc"); }
    });
  }

  textInput.addEventListener("input", function () { state.text = textInput.value.trim().toLowerCase(); state.page = 0; render(); });
  verdictSelect.addEventListener("change", function () { state.verdict = verdictSelect.value; state.page = 0; render(); });
  if (showNa) { showNa.addEventListener("change", function () { state.showNa = showNa.checked; state.page = 0; render(); }); }
  pageSizeSelect.addEventListener("change", function () { state.pageSize = parseInt(pageSizeSelect.value, 10); state.page = 0; render(); });
  prev.addEventListener("click", function () { state.page -= 1; render(); });
  next.addEventListener("click", function () { state.page += 1; render(); });
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
    th.addEventListener("click", function () {
      var key = th.dataset.key;
      if (state.sortKey === key) { state.sortDir = -state.sortDir; }
      else { state.sortKey = key; state.sortDir = columns[col[key]].numeric ? -1 : 1; }
      render();
    });
  });
  document.querySelectorAll("[data-filter-verdict]").forEach(function (link) {
    link.addEventListener("click", function (event) {
      event.preventDefault();
      verdictSelect.value = link.dataset.filterVerdict;
      verdictSelect.dispatchEvent(new Event("change"));
      table.scrollIntoView();
    });
  });
  document.querySelectorAll("[data-filter-text]").forEach(function (link) {  // a fix opens its operator rows
    link.addEventListener("click", function (event) {
      event.preventDefault();
      textInput.value = link.dataset.filterText;
      textInput.dispatchEvent(new Event("input"));
      table.scrollIntoView();
    });
  });
  state.pageSize = parseInt(pageSizeSelect.value, 10) || state.pageSize;
  render();
})();
