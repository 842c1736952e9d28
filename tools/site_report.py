"""After tools/setup_site.sh: say where each framework comes from; exit 1 if the venv shadows the site.

  python tools/site_report.py VENV      (run with the venv's python)
"""
import sys

from scaledl.hpc import doctor

if __name__ == "__main__":
    findings = doctor.check_site()
    for finding in findings:
        print(f"  {finding.level.upper() if finding.level == 'problem' else finding.level:8} {finding.text}")
        if finding.fix:
            print(f"  {'':8} fix: {finding.fix}")
    sys.exit(1 if any(f.level == "problem" for f in findings) else 0)
