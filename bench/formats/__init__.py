"""Which reader and which demangler: graphmon's choices against the libraries."""
