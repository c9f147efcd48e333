"""A permanent failure: the attachment's ``failed`` and the run's outcome land together.

The worker dies at the crash point between marking the attachment ``failed`` and the
run's terminal outcome; a client and an operator must never see one without the other.
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import Cluster, photo, pid_of, ready, sha256, start_all, wait_gone

pytestmark = pytest.mark.timeout(120)


def test_worker_dies_between_failing_the_attachment_and_the_run(cluster: Cluster) -> None:
    web = cluster.web()
    attachment_id = cluster.accepted(web, photo())
    # Forged staged bytes (no worker has run yet): every attempt fails with staging_checksum.
    staging = cluster.attachment(attachment_id)["staging_key"]
    forged = photo((32, 32))
    cluster.store.delete(staging)
    cluster.store.put_if_absent(staging, forged, sha256(forged), "image/jpeg")
    _, a = start_all(cluster, "a", crash_at={"a": "after_attachment_failed_before_run_outcome"})

    run = cluster.claimed_by(attachment_id, "a")
    wait_gone(pid_of(run["worker"]))
    a.kill()
    attachment, run = cluster.attachment(attachment_id), cluster.run(attachment_id)
    # Neither is failed: the transaction that would have written both rolled back.
    assert (attachment["state"], run["state"]) == ("processing", "running")
    assert attachment["error_code"] is None

    ready(cluster.worker("b"))
    run = cluster.wait_for(
        lambda: (r := cluster.run(attachment_id))["state"] == "failed" and r, "run failed"
    )
    assert (run["outcome"], run["attempts"]) == ("permanent", 2)
    assert "[staging_checksum]" in run["last_error"]
    attachment = cluster.attachment(attachment_id)
    assert (attachment["state"], attachment["error_code"]) == ("failed", "staging_checksum")
    assert ("reap_requeue", 1) in cluster.transitions(run["job_id"])
