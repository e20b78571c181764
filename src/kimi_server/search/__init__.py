"""Built-in web search: providers behind one interface, the local index, result formatting."""
