// kipam pool page. Plain JavaScript, no framework, nothing fetched from elsewhere.
// Every name shown goes through text nodes (textContent), never parsed as markup.
(function () {
  'use strict';

  var TOKEN_KEY = 'kipam.token';
  var POLL_MS = 2000;
  var POLL_MAX_MS = 30000;
  var PAGE = 50;

  function $(id) { return document.getElementById(id); }

  function el(tag, cls) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  // ---- numbers and addresses ------------------------------------------------------------

  // A decimal count, grouped; very large ones as d.dd × 10^n (the exact value in the title).
  function count(s) {
    s = String(s);
    if (s.length <= 12) return s.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
    var sup = '⁰¹²³⁴⁵⁶⁷⁸⁹';
    var exp = String(s.length - 1).split('').map(function (d) { return sup[Number(d)]; }).join('');
    return s[0] + '.' + s.slice(1, 3) + ' × 10' + exp;
  }

  function countEl(s, unit) {
    var e = el('span', 'count', unit ? inUnits(s, unit) : count(s));
    e.title = String(s) + ' addresses';
    return e;
  }

  // The subnet size of a prefix pool ("/64"), when its counts read better in subnets.
  function unitOf(type, request) {
    return type === 'prefix' && /^\/\d+$/.test(request || '') ? request : null;
  }

  // A count in subnets of the pool's prefix length ("4 /64s") when it is a whole number of
  // them; in addresses otherwise.
  function inUnits(s, unit, cidr) {
    var bits = (cidr || unitCidr).indexOf(':') >= 0 ? 128 : 32;
    var size = 1n << BigInt(bits - Number(unit.slice(1)));
    var n = BigInt(s);
    if (size === 1n || n % size !== 0n) return count(s);
    var k = n / size;
    return count(String(k)) + ' ' + unit + (k === 1n ? '' : 's');
  }
  var unitCidr = '';

  function parse4(t) {
    var m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(t);
    if (!m) return null;
    var v = 0n;
    for (var i = 1; i <= 4; i++) {
      var o = Number(m[i]);
      if (o > 255) return null;
      v = v * 256n + BigInt(o);
    }
    return v;
  }

  function parse6(t) {
    if (!/^[0-9a-fA-F:.]+$/.test(t)) return null;
    var tail = null;
    var dot = t.lastIndexOf(':');
    if (t.indexOf('.') >= 0) {
      tail = parse4(t.slice(dot + 1));
      if (tail === null) return null;
      t = t.slice(0, dot + 1) + '0:0';
    }
    var halves = t.split('::');
    if (halves.length > 2) return null;
    var head = halves[0] ? halves[0].split(':') : [];
    var rest = halves.length === 2 && halves[1] ? halves[1].split(':') : [];
    var groups;
    if (halves.length === 2) {
      var missing = 8 - head.length - rest.length;
      if (missing < 1) return null;
      groups = head.concat(new Array(missing).fill('0'), rest);
    } else {
      groups = head;
    }
    if (groups.length !== 8) return null;
    var v = 0n;
    for (var i = 0; i < 8; i++) {
      if (!/^[0-9a-fA-F]{1,4}$/.test(groups[i])) return null;
      v = (v << 16n) + BigInt(parseInt(groups[i], 16));
    }
    if (tail !== null) v = (v >> 32n << 32n) + tail;
    return v;
  }

  function parseAddr(t) {
    t = t.trim();
    var v4 = parse4(t);
    if (v4 !== null) return { v6: false, value: v4 };
    var v6 = parse6(t);
    if (v6 !== null) return { v6: true, value: v6 };
    return null;
  }

  // ---- colours ---------------------------------------------------------------------------

  function hue(name) {
    var h = 2166136261;
    for (var i = 0; i < name.length; i++) {
      h ^= name.charCodeAt(i);
      h = Math.imul(h, 16777619);
    }
    h ^= h >>> 15;
    h = Math.imul(h, 2246822507);
    h ^= h >>> 13;
    return ((h >>> 0) % 360);
  }

  // A colour per cluster, from a palette of well-separated colours by a hash of its name; a
  // light shade of it for a cell partly free.
  var PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1',
    '#ff9da7', '#9c755f', '#17becf', '#bcbd22', '#8c564b', '#1f77b4', '#d62728', '#2ca02c', '#9467bd'];
  function holderColour(name, light) {
    var c = PALETTE[hue(name) % PALETTE.length];
    return light ? 'color-mix(in srgb, ' + c + ' 35%, white)' : c;
  }

  // ---- data sources: the served API, or the data inlined in the offline report -----------

  var inline = $('kipam-data');
  var offline = inline ? JSON.parse(inline.textContent) : null;

  function ApiError(status, message) { this.status = status; this.message = message; }

  function get(path) {
    var token = sessionStorage.getItem(TOKEN_KEY) || '';
    return fetch(path, {
      headers: { 'Authorization': 'Bearer ' + token, 'Accept': 'application/json' },
      cache: 'no-store',
      credentials: 'omit'
    }).then(function (r) {
      return r.json().catch(function () { return null; }).then(function (body) {
        if (!r.ok) {
          var msg = body && body.error && body.error.message ? body.error.message : 'HTTP ' + r.status;
          throw new ApiError(r.status, msg);
        }
        return body;
      });
    }, function () { throw new ApiError(0, 'the controller cannot be reached'); });
  }

  var served = {
    summary: function (offset, filter) {
      return get('/ui/api/summary?offset=' + offset + '&limit=' + PAGE + '&filter=' + encodeURIComponent(filter));
    },
    detail: function (pool, dc, slice) {
      var q = slice ? '?from=' + encodeURIComponent(slice[0]) + '&to=' + encodeURIComponent(slice[1]) : '';
      return get('/ui/api/pools/' + encodeURIComponent(pool) + '/datacenters/' + encodeURIComponent(dc) + q);
    },
    lookup: function (seed, text) {
      return get('/api/v2/seeds/' + encodeURIComponent(seed) + '/addresses/' + encodeURIComponent(text));
    },
    version: function () { return get('/ui/api/version').then(function (b) { return b.version; }); }
  };

  // The report: the views the Rust side computed (the same JSON the served page fetches),
  // packed (`page::pack`, `page::report`), only read here. Unpacking puts keys and repeated
  // strings back; a map's cells come as runs, their bounds as the Rust side wrote them (a
  // prefix and a suffix glued); a lookup takes, in each pool datacenter whose CIDRs hold
  // the address, the last piece starting at or before it and reads its answer. Nothing is
  // computed here: what to draw was decided by the Rust side.
  function unpack(v, strings) {
    if (v === null || typeof v !== 'object') return v;
    var tag = v[0], i;
    if (tag < 0) return strings[-tag - 1];
    if (tag === 0) {
      var a = new Array(v.length - 1);
      for (i = 1; i < v.length; i++) a[i - 1] = unpack(v[i], strings);
      return a;
    }
    var keys = offline.shapes[tag - 1], o = {};
    for (i = 0; i < keys.length; i++) o[keys[i]] = unpack(v[i + 1], strings);
    return o;
  }
  function unpackUnit(u) { return unpack(u[1], u[0]); }

  // A packed map as the served page fetches it: every run's cell, once per step.
  function cellsOf(m) {
    var list = offline.bounds[m.bounds], cells = [];
    m.runs.forEach(function (n, r) {
      for (var j = 0; j < n; j++) {
        var k = cells.length;
        cells.push(Object.assign({ first: m.prefix + list[2 * k], last: m.prefix + list[2 * k + 1] }, m.cells[r]));
      }
    });
    return Object.assign({}, m.map, { cells: cells });
  }

  // The map of `slice` ([first, last], as the Rust side wrote them) among the pool
  // datacenter's maps, if the report holds it.
  function mapAt(d, slice) {
    for (var i = 0; i < d.maps.length; i++) {
      if (d.maps[i].map.first === slice[0] && d.maps[i].map.last === slice[1]) return d.maps[i];
    }
    return null;
  }

  var unpacked = {};
  function reportDc(key) {
    if (!(key in unpacked)) {
      var e = offline.datacenters[key];
      unpacked[key] = e ? unpackUnit(e.unit) : null;
    }
    return unpacked[key];
  }
  var offlineSummary = offline ? unpackUnit(offline.summary) : null;

  var fromFile = {
    summary: function (offset, filter) {
      var s = offlineSummary;
      var all = s.pools.filter(function (p) { return p.name.indexOf(filter) >= 0; });
      var copy = Object.assign({}, s);
      copy.pools = all.slice(offset, offset + PAGE);
      copy.matched = all.length;
      copy.offset = offset;
      copy.limit = PAGE;
      return Promise.resolve(copy);
    },
    detail: function (pool, dc, slice) {
      var d = reportDc(pool + '/' + dc);
      if (!d) return Promise.reject(new ApiError(404, 'no such pool datacenter'));
      var m = mapAt(d, slice || [d.detail.map.first, d.detail.map.last]);
      if (!m) return Promise.reject(new ApiError(404, 'this report has no map of ' + slice[0] + ' – ' + slice[1]));
      return Promise.resolve(Object.assign({}, d.detail, { map: cellsOf(m) }));
    },
    zooms: function (pool, dc, first, last) {
      var d = reportDc(pool + '/' + dc);
      return !!(d && mapAt(d, [first, last]));
    },
    lookup: function (seed, text) { return Promise.resolve(lookupInFile(text)); },
    version: function () { return Promise.resolve('file'); }
  };

  function parsedAll(list) { return list.map(function (t) { return parseAddr(t); }); }

  // The answer of pool datacenter `key` for address `a` (parsed), or null when no CIDR of it
  // holds the address.
  function answerAt(key, a) {
    var e = offline.datacenters[key];
    if (!e.parsed) e.parsed = e.cidrs.map(parsedAll);
    var inside = e.parsed.some(function (c) {
      return c[0] && c[0].v6 === a.v6 && c[0].value <= a.value && a.value <= c[1].value;
    });
    if (!inside) return null;
    var d = reportDc(key), l = d.lookup;
    if (!l.parsed) l.parsed = parsedAll(l.starts);
    // The last piece starting at or before `a`: the pieces cover every CIDR from its first
    // address, in address order.
    var lo = 0, hi = l.parsed.length - 1, at = -1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (l.parsed[mid].value <= a.value) { at = mid; lo = mid + 1; } else hi = mid - 1;
    }
    if (at < 0) return null;
    var rows = d.detail.holders.concat(l.holders);
    var rowsOf = function (list) { return list.map(function (i) { return rows[i]; }); };
    var m = Object.assign({}, l.common, l.answers[l.answer[at]]);
    m.holders = rowsOf(m.holders);
    if (m.quarantine) m.quarantine = rowsOf(m.quarantine);
    return m;
  }

  function lookupInFile(text) {
    var t = text.trim();
    if (t.indexOf('/') >= 0) {
      throw new ApiError(400, 'This report answers single addresses (10.1.2.3, 2001:db8::1); ' +
        'for "' + t + '", open its pool\'s map, or ask the page a controller serves.');
    }
    var a = parseAddr(t);
    if (!a) throw new ApiError(400, 'address: "' + t + '" is not an IP address');
    var matches = [];
    Object.keys(offline.datacenters).sort().forEach(function (key) {
      var m = answerAt(key, a);
      if (m) matches.push(m);
    });
    var msg = matches.length === 0 ? 'no pool covers ' + t :
      matches.map(function (m) { return t + m.message; }).join('; ');
    return { query: t, matches: matches, message: msg };
  }

  var source = offline ? fromFile : served;

  // ---- state -----------------------------------------------------------------------------

  var state = {
    seed: offline ? offlineSummary.seed : '',
    offset: 0,
    filter: '',
    selected: null,      // [pool, dc]
    zoom: [],            // stack of [first, last]
    version: null,
    pollDelay: POLL_MS,
    timer: null,
    lastQuery: null,
    running: false
  };

  // ---- rendering -------------------------------------------------------------------------

  function chip(text, kind) { return el('span', 'chip ' + (kind || ''), text); }

  function usageBar(u) {
    var bar = el('div', 'bar');
    [['allocated', u.allocatedPercent, u.allocated], ['excluded', u.excludedPercent, u.excluded],
     ['quarantined', u.quarantinedPercent, u.quarantined]].forEach(function (p) {
      if (p[2] === '0') return;
      var seg = el('span', 'seg ' + p[0]);
      seg.style.width = Math.max(p[1], 1) + '%';
      bar.appendChild(seg);
    });
    bar.title = 'allocated ' + u.allocated + ', excluded ' + u.excluded + ', quarantined ' +
      u.quarantined + ', free ' + u.free + ' of ' + u.total;
    return bar;
  }

  function renderTotals(s) {
    var box = $('totals');
    clear(box);
    [['Pools', s.totals.pools], ['Pool datacenters', s.totals.datacenters],
     ['Allocations', s.totals.allocations], ['Need a look', s.totals.attention]].forEach(function (t, i) {
      var card = el('div', 'card' + (i === 3 && t[1] > 0 ? ' warn' : ''), el('div', 'value', count(t[1])), el('div', 'label', t[0]));
      box.appendChild(card);
    });
  }

  function renderAttention(s) {
    var box = $('attention');
    clear(box);
    var adoptLook = s.adoption ? s.adoption.rows.filter(function (r) { return r.state === 'NeedsLook'; }) : [];
    if (s.attention.length === 0 && s.attentionPools.length === 0 && adoptLook.length === 0) { box.hidden = true; return; }
    box.hidden = false;
    box.appendChild(el('div', 'panel-head', el('h2', null, 'Needs a look')));
    var table = el('table', 'grid');
    table.appendChild(el('thead', null, el('tr', null, el('th', null, 'What'), el('th', null, 'Cluster'), el('th', null, 'Pool'), el('th', null, 'Datacenter'), el('th', null, 'Addresses'), el('th', null, 'Message'))));
    var body = el('tbody');
    s.attentionPools.forEach(function (p) {
      shownConditions(p.conditions).forEach(function (c) {
        body.appendChild(el('tr', null, el('td', null, chip(c.type, 'bad')), el('td', 'muted', '—'), el('td', null, p.pool), el('td', 'muted', '—'), el('td', 'muted', '—'), el('td', 'msg', c.message)));
      });
    });
    s.attention.forEach(function (h) {
      body.appendChild(el('tr', null, el('td', null, chip(h.attention, 'bad')), el('td', null, h.cluster), el('td', null, h.pool), el('td', null, h.datacenter), el('td', 'mono', h.addresses || '—'), el('td', 'msg', h.message || '')));
    });
    adoptLook.forEach(function (r) {
      var addrs = [];
      r.conflicts.forEach(function (c) { addrs = addrs.concat(c.addresses || []); });
      body.appendChild(el('tr', null, el('td', null, chip('Adoption', 'bad')), el('td', null, r.cluster), el('td', 'muted', '—'), el('td', null, r.datacenter), el('td', 'mono', addrs.length ? addrs.join(', ') : '—'), el('td', 'msg', r.reasons.join('; '))));
    });
    table.appendChild(body);
    box.appendChild(table);
  }

  // Adoption (spec.adopt): per cluster what its user cluster serves and what stands in the way.
  var VERDICTS = [['Adopt', 'adopt', 'ok'], ['Held', 'held', 'held'], ['Outside', 'outside', ''],
    ['Contested', 'contested', 'bad'], ['Taken', 'taken', 'bad'], ['Excluded', 'excluded', 'bad']];
  var CONFLICT_WORDS = { BothServe: 'also serves', Held: 'holds in kipam', TheirPoolCovers: 'has a MetalLB pool covering',
    CoversTheirs: 'serves, inside a MetalLB pool of this one,' };

  function renderAdoption(s) {
    var box = $('adoption');
    clear(box);
    var a = s.adoption;
    if (!a) { box.hidden = true; return; }
    box.hidden = false;
    var head = el('div', 'panel-head', el('h2', null, 'Adoption'));
    var figures = el('div', 'adopt-figures');
    Object.keys(a.summary.states).forEach(function (k) {
      figures.appendChild(chip(a.summary.states[k] + ' ' + k, k === 'NeedsLook' ? 'bad' : (k === 'Adopted' ? 'ok' : '')));
    });
    figures.appendChild(el('span', 'muted', count(a.summary.served) + ' served address' + (a.summary.served === 1 ? '' : 'es')));
    head.appendChild(figures);
    box.appendChild(head);
    var table = el('table', 'grid');
    table.appendChild(el('thead', null, el('tr', null, el('th', null, 'Cluster'), el('th', null, 'Datacenter'), el('th', null, 'State'),
      el('th', 'num', 'Served'), el('th', null, 'Addresses'), el('th', null, 'Hand-made pools'), el('th', null, 'Conflicts'))));
    var body = el('tbody');
    a.rows.forEach(function (r) {
      var counts = el('td');
      VERDICTS.forEach(function (v) {
        var n = r.verdicts[v[0]];
        if (n) counts.appendChild(chip(n + ' ' + v[1], v[2]));
      });
      if (!counts.firstChild) counts.appendChild(el('span', 'muted', '—'));
      var conflicts = el('td', 'msg');
      r.conflicts.forEach(function (c) {
        conflicts.appendChild(el('div', null, el('strong', null, c.with), ' ' + (CONFLICT_WORDS[c.kind] || c.kind) + ' ',
          el('span', 'mono', (c.addresses || []).join(', '))));
      });
      if (!r.conflicts.length) conflicts.appendChild(el('span', 'muted', '—'));
      var stateCell = el('td', null, chip(r.state, r.state === 'NeedsLook' ? 'bad' : (r.state === 'Adopted' ? 'ok' : '')));
      if (r.reasons.length) stateCell.title = r.reasons.join('\n');
      body.appendChild(el('tr', null, el('td', 'pool-name', r.cluster), el('td', null, r.datacenter), stateCell,
        el('td', 'num', count(r.served)), counts, el('td', 'mono', r.handMade.length ? r.handMade.join(', ') : '—'), conflicts));
    });
    table.appendChild(body);
    box.appendChild(table);
    if (a.rows.length < a.summary.clusters) {
      box.appendChild(el('p', 'muted', 'The first ' + a.rows.length + ' of ' + a.summary.clusters + ' clusters, those needing a look first; the REST API (/api/v2/seeds/…/adoption) lists them all.'));
    }
  }

  function unitCount(s, type, request, cidr) {
    unitCidr = cidr;
    return countEl(s, unitOf(type, request));
  }

  // A pool's conditions for the list: capacity only at its highest level.
  function shownConditions(list) {
    var levels = ['CapacityWarning', 'CapacityCritical', 'CapacityExhausted'];
    var top = -1;
    list.forEach(function (c) { top = Math.max(top, levels.indexOf(c.type)); });
    return list.filter(function (c) {
      var l = levels.indexOf(c.type);
      return l < 0 || l === top;
    });
  }

  function renderPools(s) {
    var body = $('pools').querySelector('tbody');
    clear(body);
    if (s.pools.length === 0) {
      var td = el('td', 'empty', state.filter ? 'No pool matches the filter.' : 'No pools yet.');
      td.colSpan = 9;
      body.appendChild(el('tr', null, td));
    }
    s.pools.forEach(function (p) {
      p.datacenters.forEach(function (d, i) {
        var u = d.usage;
        var nameCell = el('td', 'pool-name' + (i > 0 ? ' again' : ''), p.name);
        if (i === 0) shownConditions(p.conditions).forEach(function (c) { nameCell.appendChild(chip(c.type, 'bad')); });
        var usage = el('td', 'usage-col');
        if (u) {
          usage.appendChild(usageBar(u));
          usage.appendChild(el('span', 'pct', u.utilisationPercent + '%'));
        } else {
          usage.appendChild(el('span', 'error', (d.problems || []).join('; ')));
        }
        var holders = el('td', 'num', u ? count(u.holders) : '—');
        if (d.attention > 0) holders.appendChild(chip('! ' + d.attention, 'bad'));
        var cidrCell = el('td', 'mono', d.cidr);
        if (d.cidrs && d.cidrs.length > 1) cidrCell.title = d.cidrs.join(', ');
        var row = el('tr', 'row', nameCell, el('td', null, d.name), el('td', null, d.type),
          cidrCell, usage,
          el('td', 'num', u ? unitCount(u.free, d.type, d.request, d.cidr) : '—'),
          el('td', 'num', u ? unitCount(u.largestFreeBlock, d.type, d.request, d.cidr) : '—'),
          el('td', 'num', u ? u.fragmentationPercent + '%' : '—'), holders);
        row.dataset.pool = p.name;
        row.dataset.dc = d.name;
        row.tabIndex = 0;
        if (state.selected && state.selected[0] === p.name && state.selected[1] === d.name) row.classList.add('selected');
        row.addEventListener('click', function () { select(p.name, d.name); });
        row.addEventListener('keydown', function (e) { if (e.key === 'Enter') select(p.name, d.name); });
        body.appendChild(row);
      });
    });
    var pager = $('pager');
    clear(pager);
    var from = s.matched === 0 ? 0 : s.offset + 1, to = Math.min(s.offset + s.limit, s.matched);
    pager.appendChild(el('span', 'muted', from + '–' + to + ' of ' + s.matched + ' pools'));
    var prev = el('button', 'ghost', '‹');
    prev.disabled = s.offset === 0;
    prev.addEventListener('click', function () { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
    var next = el('button', 'ghost', '›');
    next.disabled = s.offset + s.limit >= s.matched;
    next.addEventListener('click', function () { state.offset += PAGE; refresh(); });
    pager.appendChild(prev);
    pager.appendChild(next);
  }

  function figure(label, value) {
    return el('div', 'figure', el('div', 'label', label), el('div', 'value', value));
  }

  // "1 address per cell", "a /64 per cell (1.84 × 10¹⁹ addresses)".
  function cellLabel(cidr, size) {
    if (size === '1') return '1 address per cell';
    var n = BigInt(size);
    var words = count(size) + ' addresses';
    if ((n & (n - 1n)) === 0n) {
      var bits = cidr.indexOf(':') >= 0 ? 128 : 32;
      var prefix = bits - (n.toString(2).length - 1);
      return 'a /' + prefix + ' per cell (' + words + ')';
    }
    return words + ' per cell';
  }

  function renderDetail(d) {
    var box = $('detail');
    clear(box);
    box.hidden = false;
    var close = el('button', 'ghost close', '×');
    close.title = 'Close';
    close.addEventListener('click', function () { state.selected = null; state.zoom = []; box.hidden = true; refreshPools(); });
    box.appendChild(el('div', 'panel-head', el('h2', null, d.pool + ' · ' + d.datacenter), close));
    var allCidrs = (d.cidrs || []).map(function (c) { return c.cidr; });
    box.appendChild(el('div', 'sub mono', d.type + ' ' + (allCidrs.length ? allCidrs.join(', ') : d.cidr) + (d.request ? ' · ' + d.request + ' per cluster' : '')));
    var page = el('div', 'detail-body');
    var mainCol = el('div', 'detail-main');
    var side = el('div', 'detail-side');
    page.appendChild(mainCol);
    page.appendChild(side);
    box.appendChild(page);
    box = mainCol;
    (d.problems || []).forEach(function (p) { box.appendChild(el('div', 'error', p)); });
    d.conditions.forEach(function (c) { box.appendChild(el('div', 'cond', chip(c.type, 'bad'), ' ', c.message)); });
    var u = d.usage;
    var uc = function (v) { return unitCount(v, d.type, d.request, d.cidr); };
    box.appendChild(el('div', 'figures',
      figure('Allocated', uc(u.allocated)), figure('Excluded', uc(u.excluded)),
      figure('Quarantined', uc(u.quarantined)), figure('Free', uc(u.free)),
      figure('Largest free', uc(u.largestFreeBlock)), figure('Fragmentation', u.fragmentationPercent + '%')));
    box.appendChild(usageBar(u));
    if (d.quarantineNote) box.appendChild(el('div', 'sub', d.quarantineNote));

    // The map: of one CIDR at a time, chosen above it (in fill order) when there are several.
    var m = d.map;
    var crumbs = el('div', 'crumbs');
    var cidrs = d.cidrs || [];
    var zoomFrom = 0;
    if (cidrs.length > 1) {
      // The CIDR shown: the first zoom step when it is a whole CIDR, else the one holding the map.
      var mf = parseAddr(m.first).value;
      var picker = el('div', 'cidrs');
      picker.id = 'cidrs';
      cidrs.forEach(function (c, i) {
        var on = parseAddr(c.first).value <= mf && mf <= parseAddr(c.last).value;
        var b = el('button', on ? 'cidr on' : 'cidr', c.cidr);
        b.title = (i === 0 ? 'poolCidr' : 'additionalCidrs[' + (i - 1) + ']') + ': allocated ' + c.usage.allocated +
          ', excluded ' + c.usage.excluded + ', quarantined ' + c.usage.quarantined + ', free ' + c.usage.free;
        b.appendChild(el('span', 'pct', ' ' + c.usage.utilisationPercent + '%'));
        b.addEventListener('click', function () { state.zoom = [[c.first, c.last]]; loadDetail(); });
        picker.appendChild(b);
      });
      box.appendChild(picker);
      if (state.zoom.length && cidrs.some(function (c) { return c.first === state.zoom[0][0] && c.last === state.zoom[0][1]; })) zoomFrom = 1;
    }
    var whole = el('button', 'link', cidrs.length > 1 ? 'Whole CIDR' : 'Whole pool');
    whole.addEventListener('click', function () { state.zoom = state.zoom.slice(0, zoomFrom); loadDetail(); });
    crumbs.appendChild(whole);
    state.zoom.forEach(function (z, i) {
      if (i < zoomFrom) return;
      crumbs.appendChild(document.createTextNode(' › '));
      var b = el('button', 'link', z[0] + ' – ' + z[1]);
      b.addEventListener('click', function () { state.zoom = state.zoom.slice(0, i + 1); loadDetail(); });
      crumbs.appendChild(b);
    });
    box.appendChild(el('div', 'map-head', el('h3', null, 'Address map'), crumbs,
      el('span', 'muted', cellLabel(d.cidr, m.cellSize))));
    var grid = el('div', 'map');
    grid.id = 'map';
    m.cells.forEach(function (c) {
      var cell = el('div', 'cell ' + c.state);
      if (c.holder && (c.state === 'allocated' || c.state === 'partial')) {
        cell.style.backgroundColor = holderColour(c.holder, c.state === 'partial');
        if (c.state === 'partial') cell.style.borderColor = holderColour(c.holder, false);
      }
      var lines = [c.first === c.last ? c.first : c.first + ' – ' + c.last, c.state + (c.state === 'partial' ? ' (' + c.usedPercent + '% used)' : '')];
      if (c.holder) lines.push(c.holders > 1 ? c.holder + ' and ' + (c.holders - 1) + ' more' : c.holder);
      cell.title = lines.join('\n');
      if (c.first !== c.last && (!offline || fromFile.zooms(d.pool, d.datacenter, c.first, c.last))) {
        cell.classList.add('zoomable');
        cell.addEventListener('click', function () { state.zoom.push([c.first, c.last]); loadDetail(); });
      }
      grid.appendChild(cell);
    });
    box.appendChild(grid);
    var legend = el('div', 'legend');
    [['allocated', 'Allocated (by cluster)'], ['partial', 'Partly used'], ['excluded', 'Excluded'],
     ['quarantined', 'Quarantined'], ['free', 'Free']].forEach(function (l) {
      legend.appendChild(el('span', 'key', el('span', 'swatch ' + l[0]), l[1]));
    });
    box.appendChild(legend);
    if (d.exclusions.length) box.appendChild(el('div', 'sub', 'Excluded: ', el('span', 'mono', d.exclusions.join(', '))));

    // The holders.
    box = side;
    box.appendChild(el('h3', null, 'Holders (' + d.holdersTotal + ')'));
    if (d.holders.length === 0) {
      box.appendChild(el('div', 'empty', 'No cluster holds addresses here yet.'));
      return;
    }
    var table = el('table', 'grid holders');
    table.appendChild(el('thead', null, el('tr', null, el('th', null, 'Cluster'), el('th', null, 'Addresses'), el('th', 'num', 'Size'), el('th', null, 'Phase'), el('th', null, 'Note'))));
    var body = el('tbody');
    d.holders.forEach(function (h) {
      var sw = el('span', 'swatch');
      sw.style.backgroundColor = holderColour(h.cluster, false);
      var phase = el('td', null, h.attention ? chip(h.attention, 'bad') : chip(h.phase, h.phase === 'Allocated' ? 'ok' : ''));
      var row = el('tr', null, el('td', null, sw, h.cluster), el('td', 'mono', h.addresses || '—'), el('td', 'num', unitCount(h.size, d.type, d.request, d.cidr)), phase, el('td', 'msg', h.message || ''));
      row.dataset.cluster = h.cluster;
      body.appendChild(row);
    });
    table.appendChild(body);
    box.appendChild(table);
    if (d.holders.length < d.holdersTotal) box.appendChild(el('div', 'muted', 'Showing ' + d.holders.length + ' of ' + d.holdersTotal + '; search for an address to find any other.'));
  }

  function renderLookup(a) {
    var box = $('lookup');
    clear(box);
    box.hidden = false;
    var close = el('button', 'ghost close', '×');
    close.addEventListener('click', function () { box.hidden = true; state.lastQuery = null; });
    box.appendChild(el('div', 'panel-head', el('h2', null, 'Who holds ', el('span', 'mono', a.query), '?'), close));
    box.appendChild(el('p', 'answer', a.message));
    a.matches.forEach(function (m) {
      var who = el('div', 'match',
        el('div', null, chip(m.state === 'unheld' ? 'not held' : m.state, m.state === 'free' ? 'ok' : m.state === 'excluded' || m.state === 'unheld' ? '' : 'held'), ' pool ', el('strong', null, m.pool), ' in ', el('strong', null, m.datacenter), el('span', 'muted mono', ' ' + ((m.cidrs && m.cidrs.length) ? m.cidrs.join(', ') : m.poolCidr))));
      m.holders.forEach(function (h) {
        var sw = el('span', 'swatch');
        sw.style.backgroundColor = holderColour(h.cluster, false);
        who.appendChild(el('div', 'holder', sw, el('strong', null, h.cluster), ' ', el('span', 'mono', h.addresses), ' · ', h.phase));
      });
      (m.quarantine || []).forEach(function (q) {
        who.appendChild(el('div', 'holder', el('span', 'swatch quarantined'), el('span', 'mono', q.addresses), ' · ', q.message));
      });
      if (m.more) who.appendChild(el('div', 'muted', 'and ' + m.more + ' more'));
      var open = el('button', 'link', 'Open the pool');
      open.addEventListener('click', function () { select(m.pool, m.datacenter); });
      who.appendChild(open);
      box.appendChild(who);
    });
  }

  // ---- flow ------------------------------------------------------------------------------

  function showError(e) {
    if (e && (e.status === 401 || e.status === 403)) { return signedOut(e); }
    var b = $('error');
    b.textContent = (e && e.message) ? e.message : String(e);
    b.hidden = false;
  }

  function clearError() { $('error').hidden = true; }

  function refreshPools() {
    return source.summary(state.offset, state.filter).then(function (s) {
      state.seed = s.seed;
      clear($('seed'));
      if (offline) $('seed').textContent = s.seed;
      else $('seed').append('seed ', el('strong', null, s.seed));
      renderTotals(s);
      renderAttention(s);
      renderAdoption(s);
      renderPools(s);
      clearError();
    });
  }

  function loadDetail() {
    if (!state.selected) return Promise.resolve();
    var z = state.zoom.length ? state.zoom[state.zoom.length - 1] : null;
    return source.detail(state.selected[0], state.selected[1], z).then(renderDetail, showError);
  }

  function select(pool, dc) {
    state.selected = [pool, dc];
    state.zoom = [];
    Array.prototype.forEach.call(document.querySelectorAll('#pools tr.row'), function (r) {
      r.classList.toggle('selected', r.dataset.pool === pool && r.dataset.dc === dc);
    });
    loadDetail().then(function () { $('detail').scrollIntoView({ block: 'nearest' }); });
  }

  function refresh() {
    return Promise.all([refreshPools(), loadDetail()]).catch(showError);
  }

  function find(text) {
    state.lastQuery = text;
    var p;
    try { p = source.lookup(state.seed, text); } catch (e) { p = Promise.reject(e); }
    return p.then(renderLookup, function (e) {
      if (e && (e.status === 401 || e.status === 403)) return signedOut(e);
      renderLookup({ query: text, matches: [], message: e.message });
    });
  }

  function setLive(text, bad) {
    var l = $('live');
    l.textContent = text;
    l.classList.toggle('bad', !!bad);
  }

  function poll() {
    state.timer = null;
    if (!state.running) return;
    served.version().then(function (v) {
      state.pollDelay = POLL_MS;
      var changed = v !== state.version;
      state.version = v;
      var done = changed ? refresh().then(function () {
        if (state.lastQuery && !$('lookup').hidden) return find(state.lastQuery);
      }) : Promise.resolve();
      return done.then(function () {
        setLive('Live · updated ' + new Date().toLocaleTimeString());
      });
    }, function (e) {
      if (e.status === 401 || e.status === 403) return signedOut(e);
      state.pollDelay = Math.min(state.pollDelay * 2, POLL_MAX_MS);
      setLive('Not connected (' + e.message + ') · retrying in ' + Math.round(state.pollDelay / 1000) + ' s', true);
    }).then(function () {
      if (state.running && state.timer === null) state.timer = setTimeout(poll, state.pollDelay);
    });
  }

  function signedOut(e) {
    state.running = false;
    if (state.timer) { clearTimeout(state.timer); state.timer = null; }
    sessionStorage.removeItem(TOKEN_KEY);
    $('app').hidden = true;
    $('search').hidden = true;
    $('signout').hidden = true;
    $('login').hidden = false;
    setLive('');
    var msg = '';
    if (e && e.status === 401) msg = 'The token was not accepted: ' + e.message + '.';
    else if (e && e.status === 403) msg = 'Signed in, but not allowed to see the pools: ' + e.message + '. Ask for list on ipampools and ipamallocations (ipam.kipam.dev).';
    $('login-error').textContent = msg;
    $('token').value = '';
    $('token').focus();
  }

  function start() {
    $('login').hidden = true;
    $('login-error').textContent = '';
    $('app').hidden = false;
    $('search').hidden = false;
    $('signout').hidden = !!offline;
    return refreshPools().then(function () {
      if (offline) {
        setLive(offline.generatedAt ? 'Report of ' + offline.generatedAt : 'Report');
        return;
      }
      state.running = true;
      state.version = null;
      poll();
    }, function (e) {
      if (e && (e.status === 401 || e.status === 403)) return signedOut(e);
      showError(e);
      state.running = true;
      poll();
    });
  }

  function init() {
    $('login-form').addEventListener('submit', function (e) {
      e.preventDefault();
      var t = $('token').value.trim();
      if (!t) { $('login-error').textContent = 'Paste a token first.'; return; }
      sessionStorage.setItem(TOKEN_KEY, t);
      $('token').value = '';
      start();
    });
    $('signout').addEventListener('click', function () { signedOut(null); });
    $('search').addEventListener('submit', function (e) {
      e.preventDefault();
      var t = $('q').value.trim();
      if (t) find(t);
    });
    var filterTimer = null;
    $('filter').addEventListener('input', function () {
      if (filterTimer) clearTimeout(filterTimer);
      filterTimer = setTimeout(function () {
        state.filter = $('filter').value.trim();
        state.offset = 0;
        refreshPools().catch(showError);
      }, 250);
    });
    if (offline || sessionStorage.getItem(TOKEN_KEY)) start();
    else signedOut(null);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
