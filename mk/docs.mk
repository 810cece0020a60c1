# The documentation site: mkdocs-material over docs/ (mkdocs.yml). --strict fails on a broken
# link, a missing anchor or a page left out of the nav (in `make test`).

TEST_CHECKS += docs
.PHONY: docs

docs: $(STAMP) ## build the documentation site (mkdocs build --strict)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir results/site
