// seedgate's status page, live: every 2 s it fetches /status (with the page's own query), re-renders the tables the
// server rendered from the same data, and keeps the sort, the filter and the open rows. Every value from the document
// goes into the page with textContent: what a peer sent (a node name, an SNI) is never markup.
'use strict';
(() => {
  const specEl = document.getElementById('spec');
  if (!specEl) return;
  const { page, states } = JSON.parse(specEl.textContent);
  const REFRESH_MS = 2000;
  const classes = new Map(states);
  const stateClass = (w) => classes.get(w) || 'idle';
  // By table key: the column sorted by and its direction; the table keys of nested tables are shared by all of them.
  const sorts = new Map();
  // "table/row" of each open <details>.
  const opened = new Set();

  const lookup = (v, path) => path.split('.').reduce((o, k) => (o == null ? undefined : o[k]), v);
  const num = (v) => (typeof v === 'number' ? v : 0);
  const total = (v) => (Array.isArray(v) ? v.reduce((a, x) => a + num(x), 0) : num(v));
  const text = (v) => {
    if (v == null) return '';
    if (typeof v === 'string') return v;
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  };

  const fmtBytes = (n) => {
    if (n < 1024) return n.toFixed(0) + ' B';
    const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = n / 1024;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return v.toFixed(1) + ' ' + units[i];
  };
  const fmtSecs = (x) => {
    const s = Math.max(0, Math.floor(x));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
  };
  const fmtTime = (ms) => new Date(ms).toISOString().slice(0, 19).replace('T', ' ') + ' UTC';

  // A cell's text and the number it sorts by (null: by its text), as the server's rendering makes them.
  const cell = (format, v) => {
    switch (format) {
      case 'int':
        return v == null ? ['', -1] : [text(v), num(v)];
      case 'bytes':
        return [fmtBytes(num(v)), num(v)];
      case 'secs':
        return v == null ? ['', -1] : [fmtSecs(num(v)), num(v)];
      case 'counts': {
        const counts = Object.entries(v || {})
          .map(([k, x]) => [k, total(x)])
          .filter(([, n]) => n > 0)
          .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
        // Counted but none yet reads 0; a count the document does not have stays blank.
        const shown = counts.length === 0 && v && typeof v === 'object' && !Array.isArray(v) ? '0' : counts.map(([k, n]) => k + ' ' + n).join(', ');
        return [shown, counts.reduce((a, [, n]) => a + n, 0)];
      }
      case 'series': {
        const a = Array.isArray(v) ? v : [];
        const all = a.reduce((x, y) => x + num(y), 0);
        return [(a.length ? num(a[a.length - 1]) : 0) + ' / ' + all, all];
      }
      case 'bool':
        return v === true ? ['yes', 1] : v === false ? ['no', 0] : ['', -1];
      case 'list':
        return [(Array.isArray(v) ? v : []).map(text).join(', '), null];
      default:
        return [text(v), null];
    }
  };

  const el = (tag, cls, content) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (content != null) e.textContent = content;
    return e;
  };

  const head = (t) => {
    const thead = el('thead');
    const tr = el('tr');
    for (const c of t.columns) {
      const th = el('th', null, c.label);
      th.dataset.key = c.key;
      th.scope = 'col';
      tr.appendChild(th);
    }
    thead.appendChild(tr);
    return thead;
  };

  const remember = (det, id) => {
    det.addEventListener('toggle', () => (det.open ? opened.add(id) : opened.delete(id)));
  };

  // The inner table of a row's <details>, made when it is first open: a page of a thousand
  // clusters re-renders its thousand rows every refresh, not their ten thousand sessions.
  const fill = (det, t, inner) => {
    if (det.dataset.filled === '1') return;
    det.dataset.filled = '1';
    if (!inner.length) return;
    const it = el('table', 'inner');
    it.dataset.key = t.key;
    it.appendChild(head(t));
    for (const x of inner) it.appendChild(row(t, x));
    det.appendChild(it);
    sortTable(it);
  };

  // What the filter box matches a row by: its cells' text and its inner rows' (made or not).
  const searchText = (t, r, own) => {
    const parts = [own];
    if (t.nested) {
      for (const x of lookup(r, t.nested.key) || []) {
        for (const c of t.nested.columns) parts.push(cell(c.format, lookup(x, c.key))[0]);
      }
    }
    return parts.join(' ').toLowerCase();
  };

  const row = (t, r) => {
    const body = el('tbody');
    const key = text(lookup(r, t.row_key));
    body.dataset.row = key;
    if (t.state) body.className = 'st-' + stateClass(text(lookup(r, t.state)));
    const tr = el('tr');
    for (const c of t.columns) {
      const [s, n] = cell(c.format, lookup(r, c.key));
      const td = el('td');
      if (n != null) td.dataset.sort = String(n);
      if (c.format === 'state') td.appendChild(el('span', 'badge st-' + stateClass(s), s));
      else td.textContent = s;
      tr.appendChild(td);
    }
    body.appendChild(tr);
    if (t.nested) {
      const inner = lookup(r, t.nested.key) || [];
      const ntr = el('tr', 'nested');
      const td = el('td');
      td.colSpan = t.columns.length;
      const det = el('details');
      det.dataset.row = key;
      const id = t.key + '/' + key;
      det.appendChild(el('summary', null, inner.length + ' ' + t.nested.title));
      det.open = opened.has(id);
      if (det.open) fill(det, t.nested, inner);
      det.addEventListener('toggle', () => {
        if (det.open) {
          opened.add(id);
          fill(det, t.nested, inner);
        } else {
          opened.delete(id);
        }
      });
      td.appendChild(det);
      ntr.appendChild(td);
      body.appendChild(ntr);
      body.dataset.search = searchText(t, r, tr.textContent);
    }
    return body;
  };

  // Sort a table's rows (each a tbody) by the table key's remembered column.
  const sortTable = (table) => {
    const s = sorts.get(table.dataset.key);
    const ths = table.tHead ? Array.from(table.tHead.rows[0].cells) : [];
    ths.forEach((th) => {
      th.classList.remove('asc', 'desc');
      th.removeAttribute('aria-sort');
    });
    if (!s) return;
    const i = ths.findIndex((th) => th.dataset.key === s.col);
    if (i < 0) return;
    ths[i].classList.add(s.desc ? 'desc' : 'asc');
    ths[i].setAttribute('aria-sort', s.desc ? 'descending' : 'ascending');
    const bodies = Array.from(table.tBodies).filter((b) => !b.classList.contains('empty'));
    const keyOf = (b) => {
      const td = b.rows[0] && b.rows[0].cells[i];
      if (!td) return [null, ''];
      return [td.dataset.sort != null ? Number(td.dataset.sort) : null, td.textContent];
    };
    bodies.sort((a, b) => {
      const [na, ta] = keyOf(a);
      const [nb, tb] = keyOf(b);
      const c = na != null && nb != null ? na - nb : ta.localeCompare(tb, undefined, { numeric: true });
      return s.desc ? -c : c;
    });
    for (const b of bodies) table.appendChild(b);
  };

  const sortAll = () => document.querySelectorAll('table[data-key]').forEach(sortTable);

  const filterInput = document.getElementById('filter');
  const applyFilter = () => {
    const q = (filterInput ? filterInput.value : '').trim().toLowerCase();
    document.querySelectorAll('main > section.table > table').forEach((table) => {
      for (const b of table.tBodies) {
        if (b.classList.contains('empty')) continue;
        const text = b.dataset.search != null ? b.dataset.search : b.textContent.toLowerCase();
        b.hidden = q !== '' && !text.includes(q);
      }
    });
  };

  const paging = (t, doc) => {
    const p = document.getElementById('paging');
    const g = doc.page;
    if (!p || !g) return;
    const first = g.returned === 0 ? 0 : g.offset + 1;
    p.textContent = t.title.toLowerCase() + ' ' + first + '–' + (g.offset + g.returned) + ' of ' + g.matched;
    if (g.matched !== g.total) p.appendChild(document.createTextNode(' (filtered from ' + g.total + ')'));
    const link = (offset, label) => {
      const q = new URLSearchParams(location.search);
      q.set('offset', String(offset));
      const a = el('a', null, label);
      a.href = '?' + q.toString();
      p.appendChild(document.createTextNode(' '));
      p.appendChild(a);
    };
    if (g.offset > 0) link(Math.max(0, g.offset - g.limit), 'previous');
    if (g.offset + g.returned < g.matched) link(g.offset + g.limit, 'next');
  };

  const render = (doc) => {
    for (const f of page.summary) {
      const dd = document.querySelector('#summary div[data-key="' + CSS.escape(f.key) + '"] dd');
      if (!dd) continue;
      const [s] = cell(f.format, lookup(doc, f.key));
      dd.textContent = s;
      if (f.format === 'state') dd.className = 'st-' + stateClass(s);
    }
    for (const t of page.tables) {
      const table = document.getElementById('t-' + t.key);
      if (!table) continue;
      const rows = lookup(doc, t.key) || [];
      for (const b of Array.from(table.tBodies)) b.remove();
      if (rows.length === 0) {
        const b = el('tbody', 'empty');
        const tr = el('tr');
        const td = el('td', null, t.empty);
        td.colSpan = t.columns.length;
        tr.appendChild(td);
        b.appendChild(tr);
        table.appendChild(b);
      }
      for (const r of rows) table.appendChild(row(t, r));
      if (t.paged) paging(t, doc);
    }
    sortAll();
    applyFilter();
    const at = document.getElementById('updated');
    if (at && typeof doc.generated_at_ms === 'number') {
      at.dataset.ms = String(doc.generated_at_ms);
      at.textContent = fmtTime(doc.generated_at_ms);
    }
  };

  const note = document.getElementById('refresh');
  const say = (s, failed) => {
    if (!note) return;
    note.textContent = s;
    note.classList.toggle('failed', !!failed);
  };

  const refresh = async () => {
    try {
      const r = await fetch('/status' + location.search, {
        headers: { Accept: 'application/json' },
        cache: 'no-store',
        credentials: 'same-origin',
      });
      if (!r.ok) {
        say('(refresh failed: HTTP ' + r.status + '; showing the last answer)', true);
        return;
      }
      const doc = await r.json();
      if (doc.version !== 1) {
        say('(refresh: /status has version ' + doc.version + ', this page reads version 1)', true);
        return;
      }
      render(doc);
      say('(refreshing every ' + REFRESH_MS / 1000 + ' s)', false);
    } catch (e) {
      say('(refresh failed: ' + e.message + '; showing the last answer)', true);
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  };

  document.addEventListener('click', (ev) => {
    const th = ev.target.closest && ev.target.closest('thead th[data-key]');
    if (!th) return;
    const table = th.closest('table[data-key]');
    if (!table) return;
    const key = table.dataset.key;
    const was = sorts.get(key);
    sorts.set(key, { col: th.dataset.key, desc: !!was && was.col === th.dataset.key && !was.desc });
    document.querySelectorAll('table[data-key="' + CSS.escape(key) + '"]').forEach(sortTable);
  });
  if (filterInput) filterInput.addEventListener('input', applyFilter);
  document.querySelectorAll('main details[data-row]').forEach((det) => {
    const table = det.closest('section.table > table');
    if (!table) return;
    const id = table.dataset.key + '/' + det.dataset.row;
    if (det.open) opened.add(id);
    remember(det, id);
  });
  document.body.classList.add('live');
  applyFilter();
  say('(refreshing every ' + REFRESH_MS / 1000 + ' s)', false);
  setTimeout(refresh, REFRESH_MS);
})();
