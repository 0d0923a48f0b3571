# Every stage's rule, made from its declaration (kdpipe/stages/catalog.py) and the wiring the rule files give it
# (common.smk's `stage`): the one skeleton every rule shares. Snakemake evaluates a rule's shell command once when
# the rule is made (with this loop's `_rule`) and again when a job runs, after the loop has ended: then `rule` is the
# job's rule name, and the command is the one its rule was made with.
SHELLS = {_rule["name"]: _rule["shell"] for _rule in STAGE_RULES}

for _rule in STAGE_RULES:

    rule:
        name:
            _rule["name"]
        input:
            **_rule["input"],
        output:
            **_rule["output"],
        log:
            _rule["log"],
        wildcard_constraints:
            **_rule["wildcard_constraints"],
        cache: _rule["cache"]
        priority: _rule["priority"]
        conda:
            ENV
        threads: _rule["threads"]
        resources:
            **_rule["resources"],
        params:
            **_rule["params"],
        shell:
            SHELLS[rule] if "rule" in locals() else _rule["shell"]

    workflow.get_rule(_rule["name"]).docstring = _rule["doc"]
