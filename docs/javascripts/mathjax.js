// MathJax typesets only what pymdownx.arithmatex (generic mode) marked: $...$ becomes \( \), $$...$$ \[ \].
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]] },
  options: { ignoreHtmlClass: ".*", processHtmlClass: "arithmatex" },
};
