"""`invoke doctor`: the guide's error catalogue and tuning advice as rules over gathered facts.

Gatherers collect facts (HTTP exchanges as an SDK makes them, commands run on hosts, metric figures);
each catalogue entry is one pure rule over those facts returning `Finding`s, tested from fixtures.
"""
