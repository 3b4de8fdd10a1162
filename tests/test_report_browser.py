"""The HTML reports in a real browser (Debian's Chromium through chromedriver and Selenium) at a
laptop's screen, 1366x900, and a phone's, 390x844: the demo's experiment report, the OOM drill's
incident report and the co-location drill's report, each produced for real (sims, store, renderer),
then measured with element rects (the viewport set exactly through the DevTools protocol).

A report fails when a table or a cell is wider than its box (content scrolls sideways, is cut off,
or leaves the page), when text is clipped, when a chart has no data, or when the page loads
anything from the network (performance entries beyond the page itself, and the CSP forbids it).
It opens with the answer: the verdict comes before the summary, the plan dump and the environment;
at 1366x900 the plan-against-measured table and the key chart (the page's first chart) start on
the first screen. On a phone no page is wider than its window: a table wider than the
screen scrolls inside its own box, charts scale.
Screenshots go to test-artifacts/screenshots/ (or $VRAMLAB_SCREENSHOTS), for CI to keep: the whole
page at 1366 px, the first screen at 390 px.

Without chromium + chromedriver the tests skip, unless VRAMLAB_REQUIRE_BROWSER=1 (scripts/test sets
it after installing them), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1366, 900
PHONE = (390, 844)
SHOTS = Path(os.environ.get("VRAMLAB_SCREENSHOTS") or ROOT / "test-artifacts" / "screenshots")

# Runs in the page after load (WebDriver scripts are not subject to the page's CSP). Tolerance 2 px.
# A table inside a wrapper that scrolls sideways (.tw, overflow-x auto) may be wider than the
# wrapper: that is the phone layout; the wrapper itself must fit the window.
MEASURE = r"""
const vw = document.documentElement.clientWidth, se = document.scrollingElement;
const top = el => el ? Math.round(el.getBoundingClientRect().top + window.scrollY) : null;
const out = {tables: [], clipped: [], charts: [], empty_charts: [], text_clipped: [], viewport: vw,
  inner_width: innerWidth, inner_height: innerHeight, scroll_width: se.scrollWidth,
  page_wide: se.scrollWidth > innerWidth || document.documentElement.scrollWidth > vw + 2};
document.querySelectorAll('table').forEach((t, i) => {
  const r = t.getBoundingClientRect(), wrap = t.closest('.tw');
  const box = (wrap || t.parentElement).getBoundingClientRect();
  const scrolls = !!wrap && ['auto', 'scroll'].includes(getComputedStyle(wrap).overflowX);
  const fig = t.closest('figure.table'), cap = fig && fig.querySelector('figcaption');
  const label = (cap ? cap.textContent : '') || (t.closest('section') || {id: '#' + i}).id;
  const head = Array.from(t.querySelectorAll('th')).map(h => h.textContent.trim());
  out.tables.push({label: label.trim().slice(0, 60), section: (t.closest('section') || {}).id || '', top: top(t),
                   width: Math.round(r.width), box: Math.round(box.width), scroll: t.scrollWidth,
                   client: t.clientWidth, right: Math.round(r.right), box_right: Math.round(box.right),
                   viewport: vw, columns: head.length, scrolls: scrolls,
                   wide: t.scrollWidth > t.clientWidth + 2 || r.width > box.width + 2 || r.right > vw + 2,
                   escapes: box.right > vw + 2 || (r.width > box.width + 2 && !scrolls)});
  t.querySelectorAll('td,th').forEach(c => {
    const cr = c.getBoundingClientRect();
    if (c.scrollWidth > c.clientWidth + 2 || c.scrollHeight > c.clientHeight + 2 || cr.right > r.right + 2)
      out.clipped.push(c.textContent.trim().slice(0, 60));
  });
});
document.querySelectorAll('p,li,h1,h2,h3,figcaption,code,.verdict').forEach(e => {
  if (e.closest('.tw')) return;  // inside a table's own scrolling box
  const s = getComputedStyle(e);
  if (e.scrollWidth > e.clientWidth + 2 && s.overflowX !== 'visible' || e.getBoundingClientRect().right > vw + 2)
    out.text_clipped.push(e.textContent.trim().slice(0, 60));
});
document.querySelectorAll('figure.chart').forEach(f => {
  const svg = f.querySelector('svg'), title = (f.querySelector('title') || f).textContent.trim().slice(0, 60);
  const pts = svg ? Array.from(svg.querySelectorAll('polyline')).map(p => p.getAttribute('points').trim())
    .filter(p => p.length > 0).length : 0;
  const r = (svg || f).getBoundingClientRect();
  out.charts.push({title: title, series_drawn: pts, width: Math.round(r.width), right: Math.round(r.right),
                   top: top(svg || f), section: (f.closest('section') || {}).id || ''});
  if (!svg || pts === 0 || f.querySelector('.empty') || r.right > vw + 2) out.empty_charts.push(title);
});
const key = document.querySelector('#answer figure.chart svg');
out.answer = {verdict: top(document.getElementById('verdict')), plan_dump: top(document.getElementById('plan')),
  environment: top(document.getElementById('environment')), summary: top(document.getElementById('summary')),
  key_chart: top(key), key_chart_bottom: key ? Math.round(key.getBoundingClientRect().bottom + window.scrollY) : null,
  verdict_status: (document.getElementById('verdict') || {className: ''}).className,
  height: se.scrollHeight};
const here = location.href.split('#')[0];
out.network = performance.getEntriesByType('resource').map(e => e.name).filter(n => n !== here);
out.csp = (document.querySelector('meta[http-equiv="Content-Security-Policy"]') || {content: ''}).content;
return JSON.stringify(out);
"""


def _browser() -> tuple[str, str]:
    chrome = next((shutil.which(c) for c in ("chromium", "chromium-browser") if shutil.which(c)), None)
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        chrome = None
    if not chrome or not driver:
        if os.environ.get("VRAMLAB_REQUIRE_BROWSER") == "1":
            pytest.fail("VRAMLAB_REQUIRE_BROWSER=1 but chromium, chromedriver or selenium is missing")
        pytest.skip(
            "no browser: apt-get install chromium chromium-driver, pip install selenium (scripts/test does)"
        )
    return chrome, driver


@pytest.fixture(scope="module")
def browser():
    chrome, driver_path = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="vramlab-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},{HEIGHT}",
    ):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    drv.set_page_load_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _viewport(drv, width: int, height: int, mobile: bool = False) -> None:
    """The page's viewport, exactly (a headless window's size includes no chrome, but is not the
    viewport on every version; a phone's 390 px is below the smallest window Chromium opens)."""
    drv.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
    )


def measure(drv, path: Path, shot: str | None = None, size: tuple[int, int] = (WIDTH, HEIGHT)) -> dict:
    """Load *path* in a *size* viewport (a phone's when narrower than 600 px), return what MEASURE
    saw; save a screenshot as *shot*.png: the whole page at a laptop's width, the first screen on a
    phone."""
    width, height = size
    phone = width < 600
    _viewport(drv, width, height, mobile=phone)
    drv.get(path.resolve().as_uri())
    got = json.loads(drv.execute_script(MEASURE))
    if shot:
        SHOTS.mkdir(parents=True, exist_ok=True)
        if not phone:
            full = drv.execute_script("return document.documentElement.scrollHeight")
            _viewport(drv, width, min(int(full) + 20, 16000))
        drv.save_screenshot(str(SHOTS / f"{shot}.png"))
        _viewport(drv, width, height, mobile=phone)
        (SHOTS / f"{shot}.json").write_text(json.dumps(got, indent=1))
    return got


def problems(got: dict) -> list[str]:
    out = [
        f"table wider than its box: {t['label']} ({t['width']} px in {t['box']} px, scroll {t['scroll']})"
        for t in got["tables"]
        if t["wide"]
    ]
    out += [f"clipped cell: {c}" for c in got["clipped"]]
    out += [f"clipped text: {c}" for c in got["text_clipped"]]
    out += [f"chart without data: {c}" for c in got["empty_charts"]]
    out += [f"network load: {n}" for n in got["network"]]
    if got["page_wide"]:
        out.append("page wider than the window")
    if "default-src 'none'" not in got["csp"]:
        out.append("no CSP forbidding fetches")
    return out


# -- the three reports, produced for real ----------------------------------------------------------


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    _browser()  # skip before spending a minute on sims when there is no browser
    from vramlab.demo.drill import run_drill_demo
    from vramlab.demo.experiment import run_demo
    from vramlab.report import load_context, render
    from vramlab.store import open_store

    tmp = tmp_path_factory.mktemp("browser-reports")
    db = str(tmp / "s.db")
    out = {
        "experiment": tmp / "experiment.html",
        "incident": tmp / "incident.html",
        "colocation": tmp / "colocation.html",
    }
    run_demo(db, out["experiment"], rounds=2, duration_s=1.5)
    run_drill_demo(db, out["incident"], baseline_s=1.5, step_s=0.6, observe_s=1.5)
    doc = yaml.safe_load((ROOT / "examples" / "colocation-drill.yaml").read_text())
    doc["target"]["sim"]["device"] = str(tmp / "gpu0.ledger")
    doc["baseline_s"], doc["ramp"]["step_s"] = 1.0, 0.5
    plan = tmp / "colocation.yaml"
    plan.write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "vramlab", "drill", str(plan), "--db", db, "-o", str(tmp / "c.md")],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    run_id = re.search(r"run ([0-9a-f]{8})", res.stderr).group(1)  # type: ignore[union-attr]
    with open_store(db) as store:
        out["colocation"].write_text(render(load_context(store, run_id), "html"), encoding="utf-8")
    return out


def phone_problems(got: dict) -> list[str]:
    """What leaves a phone's screen: a table whose box does (or that is wider than a box that does
    not scroll), clipped cells or text, a chart past the edge, a page wider than its window."""
    out = [
        f"table leaves the screen: {t['label']} ({t['width']} px, box right {t['box_right']} px of {t['viewport']})"
        for t in got["tables"]
        if t["escapes"]
    ]
    out += [f"clipped cell: {c}" for c in got["clipped"]]
    out += [f"clipped text: {c}" for c in got["text_clipped"]]
    out += [f"chart without data or past the edge: {c}" for c in got["empty_charts"]]
    if got["page_wide"]:
        out.append(f"page {got['scroll_width']} px wide in a {got['inner_width']} px window")
    return out


def _answer_first(got: dict, kind: str) -> None:
    a = got["answer"]
    assert a["verdict"] is not None and a["plan_dump"] is not None, (kind, a)
    # the verdict, then the summary and the tables; the full plan and the environment last
    assert a["verdict"] < a["summary"] < a["plan_dump"] < a["environment"], (kind, a)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["experiment", "incident", "colocation"])
def test_report_reads_at_laptop_width(browser, reports, kind):
    got = measure(browser, reports[kind], f"{kind}-1366")
    assert (got["inner_width"], got["inner_height"]) == (WIDTH, HEIGHT)
    assert got["tables"], f"{kind}: no tables rendered"
    assert problems(got) == [], f"{kind} at {WIDTH} px: " + "; ".join(problems(got)[:10])
    assert got["scroll_width"] <= got["inner_width"], got["scroll_width"]
    _answer_first(got, kind)
    if kind != "colocation":
        assert got["charts"] and all(c["series_drawn"] > 0 for c in got["charts"]), got["charts"]
    # the answer's key chart starts on the first screen, before any scrolling, and is the page's first
    key = got["answer"]["key_chart"]
    assert key is not None and key < HEIGHT, got["answer"]
    assert min(c["top"] for c in got["charts"]) == key, got["charts"]
    # and so does the plan against measured, in a few lines, above the chart
    pvm = [
        t
        for t in got["tables"]
        if t["section"] == "answer" and t["label"].startswith("Plan against measured")
    ]
    assert len(pvm) == 1 and pvm[0]["columns"] == 5, pvm
    assert got["answer"]["verdict"] < pvm[0]["top"] < key, (pvm, got["answer"])
    # The per-round and per-step signals (waiting, KV, GPU memory, delta P95) are on screen, not scrolled away.
    if kind == "experiment":
        signal = [t for t in got["tables"] if t["label"].startswith("Service and resource signals")]
        assert len(signal) == 2 and all(t["right"] <= t["viewport"] for t in signal), signal
    # Plan against measured: the composition table (nine columns) and the KV-in-use table fit the screen too.
    if kind in ("experiment", "incident"):
        comp = [t for t in got["tables"] if t["section"] == "composition"]
        assert any(t["label"].startswith("Resident model, KV cache") and t["columns"] == 9 for t in comp), (
            comp
        )
        assert any(t["label"].startswith("KV cache in use") for t in comp), comp
        assert all(t["right"] <= t["viewport"] for t in comp), comp


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["experiment", "incident", "colocation"])
def test_report_fits_a_phone(browser, reports, kind):
    got = measure(browser, reports[kind], f"{kind}-390", size=PHONE)
    assert got["inner_width"] == PHONE[0], got["inner_width"]
    assert got["scroll_width"] <= got["inner_width"], f"{kind}: page {got['scroll_width']} px wide"
    assert phone_problems(got) == [], f"{kind} at {PHONE[0]} px: " + "; ".join(phone_problems(got)[:10])
    _answer_first(got, kind)
    # the wide tables are there and scroll inside their own box: the check measured the case it is for
    wide = [t for t in got["tables"] if t["width"] > t["box"] + 2]
    assert wide and all(t["scrolls"] for t in wide), wide
    assert all(c["right"] <= got["viewport"] for c in got["charts"]), got["charts"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_reports_print_on_a4_without_cut_tables(browser, reports):
    """The print stylesheet: A4 portrait (about 720 CSS px between 12 mm margins) in print media."""
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        for kind, path in reports.items():
            _viewport(browser, 720 + 16, HEIGHT)
            browser.get(path.resolve().as_uri())
            got = json.loads(browser.execute_script(MEASURE))
            wide = [p for p in problems(got) if p.startswith(("table wider", "page wider", "clipped"))]
            assert wide == [], f"{kind} in print at A4 width: " + "; ".join(wide[:8])
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})


# -- the check itself can fail ----------------------------------------------------------------------

BAD = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body{max-width:1200px;margin:auto} table{display:block;overflow-x:auto} td{white-space:nowrap}</style></head><body>
<section id="timeline"><table><thead><tr><th>t</th><th>what</th></tr></thead>
<tbody><tr><td>7.40</td><td>CELL</td></tr></tbody></table></section></body></html>"""
OOM = (
    "[2026-12-01 15:23:20] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 568.00 MiB. GPU 0 has a "
    "total capacity of 22.49 GiB of which 446.00 MiB is free. Including non-PyTorch memory, this process has 20.82 "
    "GiB memory in use. Of the allocated memory 19.90 GiB is allocated by PyTorch"
)


def test_the_check_fails_on_a_long_cell_in_a_nowrap_column(browser, tmp_path):
    assert len(OOM) >= 250
    bad = tmp_path / "bad.html"
    bad.write_text(BAD.replace("CELL", OOM))
    found = problems(measure(browser, bad))
    assert any(p.startswith("table wider than its box") for p in found), found
    assert any(p.startswith("clipped cell") for p in found), found


def test_the_check_fails_on_network_loads_and_empty_charts(browser, tmp_path):
    from vramlab.report import html
    from vramlab.report.blocks import Chart, Series, Table
    from vramlab.report.sections import Document, RenderedSection

    doc = Document(
        "t",
        "s",
        [
            RenderedSection(
                "a", "A", [Table(["what"], [[OOM]]), Chart("empty", "x", "y", [Series("none", [])])]
            )
        ],
    )
    page = html.render(doc)
    ok = tmp_path / "ok.html"
    ok.write_text(page)
    found = problems(measure(browser, ok))
    # the 250-character cell wraps in the real renderer; only the empty chart is reported
    assert len(found) == 1 and found[0].startswith("chart without data: empty"), found
    leaky = tmp_path / "leaky.html"
    leaky.write_text(
        BAD.replace("CELL", "short").replace("</body>", '<img src="http://127.0.0.1:9/x.png"></body>')
    )
    assert any(p.startswith("network load") for p in problems(measure(browser, leaky)))


def test_the_phone_check_fails_when_a_wide_table_has_no_box_of_its_own(browser, tmp_path):
    """The same wide table in the real renderer fits a phone (it scrolls in its wrapper); without the
    wrapper's rule the page itself is wider than the phone's window."""
    from vramlab.report import html
    from vramlab.report.blocks import Table
    from vramlab.report.sections import Document, RenderedSection

    wide = Table([f"column {i}" for i in range(14)], [[f"{i * 1000:,}.00" for i in range(14)]], "wide")
    page = html.render(Document("t", "s", [RenderedSection("a", "A", [wide])]))
    ok, bad = tmp_path / "ok.html", tmp_path / "bad.html"
    ok.write_text(page)
    bad.write_text(page.replace(".tw{overflow-x:auto;max-width:100%}", ""))
    fine = measure(browser, ok, size=PHONE)
    assert fine["inner_width"] == PHONE[0] and phone_problems(fine) == [], phone_problems(fine)
    assert fine["tables"][0]["scrolls"] and fine["tables"][0]["width"] > fine["tables"][0]["box"]
    broken = measure(browser, bad, size=PHONE)
    assert any(p.startswith("page ") for p in phone_problems(broken)), phone_problems(broken)
