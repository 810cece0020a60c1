"""Lambda's event sources, one module each: what invokes which function, when, with what, and
what happens to a batch that fails (as AWS documents it, with the settings of template.yaml)."""
