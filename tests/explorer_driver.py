"""Drive a course widget in a real browser the way a learner does.

Every widget of the course is a ``course_widgets.base.Explorer``: an element
with the CSS classes ``course-explorer`` and its topic's class, whose controls
sit inside ``.explorer-controls``. That is all this module relies on, so it
covers every notebook's widgets without knowing them:

    explorer = ExplorerOnPage.all_in(page, cell_locator)[0]
    for control in explorer.controls():
        explorer.arm()
        undo = explorer.give_input(control)        # a key press, a click, a choice
        change = explorer.wait_for_change()        # pixels or text outside the controls
        change.latency_ms                          # from the input event to the change

One real input per kind of control: a slider's handle gets the focus and an
arrow key; a checkbox, toggle button or button a click; a dropdown or list
another option; toggle and radio buttons a click on another choice; a text box
a typed letter and Enter; a number box an arrow key and Enter. ``give_input``
returns the input that undoes it (None for a plain button), so a test can leave
a shared notebook as it found it.

Timing happens in the page: an init script (``PROBE``) notes the time of the
first input event after ``arm()`` and of every drawing call on a canvas, and a
MutationObserver the time of the last change of text outside the controls.
A change's latency is the time of the drawing call (or text mutation) that made
it, minus the input event's time; it is found within one animation frame.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Installed in every page before JupyterLab's own scripts (page.add_init_script).
PROBE = r"""
(() => {
  if (window.__courseProbe) return;
  const lastDraw = new WeakMap();
  const proto = CanvasRenderingContext2D.prototype;
  for (const name of ["drawImage", "putImageData", "fillRect", "fill", "stroke", "fillText", "strokeText"]) {
    const original = proto[name];
    proto[name] = function (...args) {
      lastDraw.set(this.canvas, performance.now());
      return original.apply(this, args);
    };
  }
  const probe = {
    armed: false, armedAt: 0, inputAt: null, baselines: {}, mutatedAt: {}, activeAt: {}, observers: {},
    lastDraw: canvas => lastDraw.get(canvas) || 0,
  };
  const onInput = () => { if (probe.armed && probe.inputAt === null) probe.inputAt = performance.now(); };
  for (const type of ["keydown", "pointerdown", "mousedown", "input", "change"]) {
    window.addEventListener(type, onInput, true);
  }
  // what an explorer shows: its canvases' pixels and its text, both outside its controls
  probe.outside = (root, node) => {
    const controls = root.querySelector(".explorer-controls");
    return !controls || !controls.contains(node);
  };
  probe.canvases = root => [...root.querySelectorAll("canvas")].filter(c => probe.outside(root, c));
  probe.text = root => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    const parts = [];
    while (walker.nextNode()) {
      if (probe.outside(root, walker.currentNode)) parts.push(walker.currentNode.textContent);
    }
    return parts.join("\n");
  };
  probe.pixels = canvas => (canvas.width && canvas.height ? canvas.toDataURL() : "");
  probe.element = id => document.querySelector(`[data-course-explorer="${id}"]`);
  probe.arm = id => {
    const root = probe.element(id);
    const canvases = probe.canvases(root);
    probe.baselines[id] = { pixels: canvases.map(probe.pixels), text: probe.text(root), count: canvases.length };
    probe.mutatedAt[id] = 0;
    if (!probe.observers[id]) {
      probe.observers[id] = new MutationObserver(records => {
        if (records.some(r => probe.outside(root, r.target))) probe.mutatedAt[id] = probe.activeAt[id] = performance.now();
      });
      probe.observers[id].observe(root, { subtree: true, childList: true, characterData: true, attributes: true });
    }
    probe.inputAt = null;
    probe.armedAt = performance.now();
    probe.armed = true;
  };
  // false until the explorer shows something else than when armed; then what and when
  probe.changed = (id, pixelsOnly) => {
    const root = probe.element(id);
    const base = probe.baselines[id];
    const canvases = probe.canvases(root);
    if (canvases.length !== base.count) return { what: "canvases", at: performance.now(), inputAt: probe.inputAt };
    for (let i = 0; i < canvases.length; i++) {
      const drawnAt = probe.lastDraw(canvases[i]);
      if (drawnAt > probe.armedAt && probe.pixels(canvases[i]) !== base.pixels[i]) {
        return { what: "pixels", at: drawnAt, inputAt: probe.inputAt };
      }
    }
    if (!pixelsOnly && probe.text(root) !== base.text) {
      return { what: "text", at: probe.mutatedAt[id] || performance.now(), inputAt: probe.inputAt };
    }
    return false;
  };
  // the last time the explorer's canvases were drawn on or its text changed
  probe.activity = id => Math.max(probe.activeAt[id] || 0, ...probe.canvases(probe.element(id)).map(probe.lastDraw));
  // a canvas (ipympl stacks a transparent one on top of the figure's) shows more than one colour
  // (a widget without a canvas: it shows some text besides its controls)
  probe.drawn = id => (probe.canvases(probe.element(id)).length === 0
    ? probe.text(probe.element(id)).trim() !== ""
    : probe.canvases(probe.element(id)).some(canvas => {
    if (!canvas.width || !canvas.height) return false;
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 4; i < data.length; i += 4) {
      if (data[i] !== data[0] || data[i + 1] !== data[1] || data[i + 2] !== data[2] || data[i + 3] !== data[3]) return true;
    }
    return false;
  }));
  window.__courseProbe = probe;
})();
"""

# The controls a course widget may use, as ipywidgets 8 renders them. Order
# matters: the first selector an element matches names its kind.
CONTROL_KINDS = {
    "slider": ".widget-slider",
    "checkbox": ".widget-checkbox",
    "dropdown": ".widget-dropdown",
    "select": ".widget-select",
    "toggle-buttons": ".widget-toggle-buttons",
    "toggle-button": ".widget-toggle-button",
    "button": ".widget-button",
    "radio": ".widget-radio",
    "textarea": ".widget-textarea",
    "text": ".widget-text",
}
# Generic (non-topic) classes on an explorer's element.
_GENERIC_CLASS_PREFIXES = ("lm-", "jp-", "p-", "widget-", "jupyter-")
_GENERIC_CLASSES = {"course-explorer", "has-problem"}

_ids = itertools.count()


def install_probe(page) -> None:
    """Make every later navigation of ``page`` carry the probe."""
    page.add_init_script(PROBE)


@dataclass
class Control:
    kind: str
    locator: object  # playwright Locator of the control's element
    label: str

    def __str__(self) -> str:
        return f"{self.kind} {self.label!r}" if self.label else self.kind


@dataclass
class Change:
    what: str  # "pixels", "text" or "canvases"
    latency_ms: float | None  # None when no input event was seen (it happened before arm())


class ExplorerOnPage:
    """One course widget (an element with class ``course-explorer``) in a page."""

    def __init__(self, page, element_locator):
        self.page = page
        self.id = element_locator.get_attribute("data-course-explorer")
        if self.id is None:
            self.id = str(next(_ids))
            element_locator.evaluate("(e, id) => e.setAttribute('data-course-explorer', id)", self.id)
        self.locator = page.locator(f'[data-course-explorer="{self.id}"]')

    @classmethod
    def all_in(cls, page, scope=None) -> list[ExplorerOnPage]:
        """The explorers in ``page`` (or inside the locator ``scope``), in document order."""
        elements = (scope or page).locator(".course-explorer")
        return [cls(page, elements.nth(i)) for i in range(elements.count())]

    @property
    def classes(self) -> list[str]:
        return (self.locator.get_attribute("class") or "").split()

    @property
    def topic_class(self) -> str:
        """The widget's own CSS class (its Explorer subclass's ``css_class``)."""
        own = [c for c in self.classes if c not in _GENERIC_CLASSES and not c.startswith(_GENERIC_CLASS_PREFIXES)]
        return own[0] if own else "course-explorer"

    @property
    def problem(self) -> str:
        """The widget's 'implement this first' message, '' when it shows results."""
        if "has-problem" not in self.classes:
            return ""
        return self.locator.locator(".explorer-message").inner_text()

    def drawn(self) -> bool:
        """The widget's figure has been drawn: a canvas shows more than one colour."""
        return self.page.evaluate("id => window.__courseProbe.drawn(id)", self.id)

    def canvas_count(self) -> int:
        return self.page.evaluate(
            "id => window.__courseProbe.canvases(window.__courseProbe.element(id)).length", self.id
        )

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.locator.scroll_into_view_if_needed()
        self.locator.screenshot(path=path)

    # -- controls and inputs
    def controls(self) -> list[Control]:
        """The enabled controls inside ``.explorer-controls``, in order."""
        found = []
        elements = self.locator.locator(".explorer-controls .lm-Widget")
        for i in range(elements.count()):
            element = elements.nth(i)
            classes = (element.get_attribute("class") or "").split()
            kind = next((k for k, css in CONTROL_KINDS.items() if css[1:] in classes), None)
            if kind is None or self._disabled(element, kind):
                continue
            label = (
                element.locator(".widget-label").first.inner_text() if element.locator(".widget-label").count() else ""
            )
            if kind in ("button", "toggle-button"):
                label = element.inner_text()
            elif kind == "checkbox":
                label = element.locator(".widget-label-basic").inner_text()
            found.append(Control(kind, element, label.strip()))
        return found

    @staticmethod
    def _disabled(element, kind: str) -> bool:
        if kind == "slider":
            return element.locator(".noUi-target[disabled]").count() > 0
        return element.evaluate(
            "e => [e, ...e.querySelectorAll('input, select, textarea, button')].some(x => x.disabled)"
        )

    def arm(self) -> None:
        """Note what the widget shows now; the next input event starts the clock."""
        self.page.evaluate("id => window.__courseProbe.arm(id)", self.id)

    def give_input(self, control: Control) -> Callable[[], None] | None:
        """One real input on ``control``; returns the input that undoes it (None: cannot)."""
        page, element = self.page, control.locator
        element.scroll_into_view_if_needed()
        if control.kind == "slider":
            handle = element.locator(".noUi-handle").last  # a range slider: its upper handle
            now, top = (float(handle.get_attribute(a)) for a in ("aria-valuenow", "aria-valuemax"))
            key, back = ("ArrowRight", "ArrowLeft") if now < top else ("ArrowLeft", "ArrowRight")
            return self._press(handle, key, back)
        if control.kind == "checkbox":
            box = element.locator("input[type=checkbox]")
            box.click()
            return box.click
        if control.kind in ("dropdown", "select"):
            menu = element.locator("select")
            was = menu.input_value()
            values = menu.locator("option").evaluate_all("options => options.map(o => o.value)")
            menu.select_option(values[(values.index(was) + 1) % len(values)])
            return lambda: menu.select_option(was)
        if control.kind == "toggle-buttons":
            buttons = element.locator("button")
            active = element.locator("button.mod-active")
            was = active.first.inner_text() if active.count() else None
            other = element.locator("button:not(.mod-active)").first
            other.click()
            return (lambda: buttons.filter(has_text=was).first.click()) if was is not None else None
        if control.kind in ("toggle-button", "button"):
            element.click()
            return element.click if control.kind == "toggle-button" else None
        if control.kind == "radio":
            choices = element.locator("input[type=radio]")
            checked = [i for i in range(choices.count()) if choices.nth(i).is_checked()]
            target = next(i for i in range(choices.count()) if i not in checked)
            choices.nth(target).click()
            return (lambda: choices.nth(checked[0]).click()) if checked else None
        if control.kind in ("text", "textarea"):
            box = element.locator("input, textarea").first
            if box.get_attribute("type") == "number":
                step, back = ("ArrowUp", "ArrowDown")
                top = box.get_attribute("max")
                if top is not None and box.input_value() and float(box.input_value()) >= float(top):
                    step, back = back, step
                return self._press(box, step, back, then="Enter")
            box.click()
            page.keyboard.press("End")
            page.keyboard.type("s")
            if control.kind == "text":
                page.keyboard.press("Enter")

            def undo():
                box.click()
                page.keyboard.press("End")
                page.keyboard.press("Backspace")
                if control.kind == "text":
                    page.keyboard.press("Enter")

            return undo
        raise ValueError(f"no input known for a {control.kind}")

    def _press(self, target, key: str, back: str, then: str | None = None) -> Callable[[], None]:
        def press(which: str) -> None:
            target.focus()
            self.page.keyboard.press(which)
            if then:
                self.page.keyboard.press(then)

        press(key)
        return lambda: press(back)

    # -- one named input, as a topic's test gives it
    def key_on(self, slider_class: str, key: str) -> None:
        """A key press on the handle of the slider with CSS class ``slider_class``;
        waits until the figure's pixels change and the widget is quiet again."""
        self.arm()
        handle = self.locator.locator(f".{slider_class} .noUi-handle")
        handle.scroll_into_view_if_needed()
        handle.focus()
        self.page.keyboard.press(key)
        assert self.wait_for_change(pixels_only=True).what == "pixels"
        self.settle()

    def click_on(self, selector: str, has_text: str | None = None) -> None:
        """A click on the element ``selector`` inside the widget (the one showing
        ``has_text`` if given); waits as ``key_on`` does."""
        self.arm()
        target = self.locator.locator(selector, has_text=has_text) if has_text else self.locator.locator(selector)
        target.scroll_into_view_if_needed()
        target.click()
        assert self.wait_for_change(pixels_only=True).what == "pixels"
        self.settle()

    def text_of(self, selector: str) -> str:
        return self.locator.locator(selector).inner_text()

    def settle(self, quiet_ms: float = 300, timeout_s: float = 60) -> None:
        """Wait until the kernel is idle and the widget has neither drawn nor changed
        its text for ``quiet_ms``: the last input's effects are all shown."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            quiet = self.page.evaluate(
                "([id, quiet]) => performance.now() - window.__courseProbe.activity(id) > quiet", [self.id, quiet_ms]
            )
            if quiet and self.page.get_by_text("(ipykernel) | Idle").count():
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.topic_class}: still busy after {timeout_s:.0f} s")

    def wait_for_change(self, pixels_only: bool = False, timeout_s: float = 30) -> Change:
        """Wait until the widget shows something else than when armed (pixels, or text
        outside its controls unless ``pixels_only``); raise AssertionError after ``timeout_s``."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            handle = self.page.wait_for_function(
                "([id, pixelsOnly]) => window.__courseProbe.changed(id, pixelsOnly)",
                arg=[self.id, pixels_only],
                polling="raf",
                timeout=timeout_s * 1000,
            )
        except PlaywrightTimeout:
            raise AssertionError(f"{self.topic_class}: nothing it shows changed within {timeout_s:.0f} s") from None
        found = handle.json_value()
        self.page.evaluate("window.__courseProbe.armed = false")
        input_at = found["inputAt"]
        latency = None if input_at is None else max(0.0, found["at"] - input_at)
        return Change(found["what"], latency)
