# Optional: a periodic sweep on every client, beside the in-chain clean-up. Nomad spreads the work: a
# sysbatch job runs once on each eligible client. Needs raw_exec enabled on the clients (see client.hcl).
job "cni-reaper-sweep" {
  type        = "sysbatch"
  datacenters = ["*"]

  periodic {
    crons            = ["*/15 * * * *"]
    prohibit_overlap = true
  }

  group "sweep" {
    task "sweep" {
      driver = "raw_exec"

      config {
        command = "/opt/cni/bin/cni-reaper"
        # --orphans also removes rules tagged for containers cni-reaper never recorded (leaks from
        # before it was installed) whose network namespace is gone
        args = ["sweep", "--apply", "--orphans"]
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
