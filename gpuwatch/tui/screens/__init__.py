"""Screens. A live screen says what it needs (`view()`) and renders what it gets (`show()`);
the app's one poll worker does the fetching. Adding a screen = one module here + one
`View.kind` the source understands."""
