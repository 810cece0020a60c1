# Template checks: cfn-lint, sam validate --lint, sam build, checkov (in `make test`).
# aws-sam-cli and checkov pin versions that conflict with requirements/dev.lock (and with each
# other), so each lives in its own venv under .tools/, installed from its pinned file.

TOOLS := .tools
SAM_VENV := $(TOOLS)/sam
CHECKOV_VENV := $(TOOLS)/checkov
SAM := $(SAM_VENV)/bin/sam
CHECKOV := $(CHECKOV_VENV)/bin/checkov
SAM_STAMP := $(SAM_VENV)/.installed
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
SAM_BUILD_DIR := .aws-sam/build
# sam build needs python3.12 on PATH (BuildMethod python3.12). With pyenv, this puts 3.12
# next to the default 3.11; without pyenv the variable is ignored and PATH must have it.
SAM_PYENV_VERSION ?= 3.11.7:3.12.1
# Nothing here talks to AWS: no telemetry, a region only for the CLI's own configuration.
TEMPLATE_ENV := SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 PYENV_VERSION=$(SAM_PYENV_VERSION)

TEST_CHECKS += template-check
.PHONY: template-check template-lint template-build template-scan tools

$(SAM_STAMP): requirements/tools-sam.txt
	rm -rf $(SAM_VENV)
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/tools-sam.txt
	touch $@

$(CHECKOV_STAMP): requirements/tools-checkov.txt
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/tools-checkov.txt
	touch $@

tools: $(SAM_STAMP) $(CHECKOV_STAMP) ## install aws-sam-cli and checkov into .tools/ (pinned)

# cfn-lint checks the SAM template against SAM's schemas; `sam validate` (without --lint) runs
# the SAM translator itself, which catches what only the transform rejects.
template-lint: $(STAMP) $(SAM_STAMP) ## cfn-lint, sam validate --lint and the SAM transform on template.yaml
	$(VENV)/bin/cfn-lint template.yaml
	$(TEMPLATE_ENV) $(SAM) validate --lint --template-file template.yaml
	$(TEMPLATE_ENV) $(SAM) validate --template-file template.yaml

template-build: $(SAM_STAMP) ## sam build (layer and functions for arm64) into .aws-sam/build
	$(TEMPLATE_ENV) $(SAM) build --template-file template.yaml --build-dir $(SAM_BUILD_DIR)

template-scan: $(CHECKOV_STAMP) ## checkov on template.yaml: no failed checks (skips are in the template)
	$(CHECKOV) --file template.yaml --framework cloudformation --skip-download --compact --quiet

template-check: template-lint template-build template-scan ## all template checks
