// MathJax typesets the guides' math (pymdownx.arithmatex turns $...$ into \( \) and $$...$$ into \[ \])
// and the lessons' (nbconvert leaves a notebook's $...$ as it is). Code blocks are never touched.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
  },
};
