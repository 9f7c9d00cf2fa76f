# Optional: a periodic sweep on every client, beside the in-chain clean-up, that also leaves the counters
# for node_exporter's textfile collector. Nomad spreads the work: a sysbatch job runs once on each eligible
# client. Needs raw_exec enabled on the clients (see client.hcl).
#
# Nothing of the conflists is repeated here: cni-reaper reads every conflist in /opt/cni/config (Nomad's
# default cni_config_dir; add --cni-conf-dir DIR to both commands if yours is elsewhere) and sweeps each
# network that chains it with that conflist's own keys (stateDir, ipamDataDir, cniCacheDir, backend, logFile).
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
        command = "/bin/sh"
        # sweep --orphans also removes rules tagged for containers cni-reaper never recorded (leaks from
        # before it was installed) whose network namespace is gone. The job fails when the sweep left
        # something (exit 4); the metrics are written either way (skipped if the directory is missing).
        args = ["-c", "/opt/cni/bin/cni-reaper sweep --apply --orphans; rc=$?; if [ -d \"$TEXTFILE_DIR\" ]; then /opt/cni/bin/cni-reaper metrics --textfile \"$TEXTFILE_DIR\"; fi; exit $rc"]
      }

      env {
        # node_exporter's --collector.textfile.directory (Debian's prometheus-node-exporter default)
        TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
        # Optional: Nomad's word on its allocations (README, "The scheduler's word"), asked of this client
        # through the task API socket with the task's workload identity (Nomad 1.7+; attach a policy with
        # agent:read, node:read and read-job to the job: `nomad acl policy apply -job cni-reaper-sweep ...`).
        # CNI_REAPER_NOMAD = "1"
        # NOMAD_ADDR       = "unix://${NOMAD_SECRETS_DIR}/api.sock"
      }

      # identity {
      #   env = true   # NOMAD_TOKEN: the workload identity the task API takes
      # }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
