// runc-capfilter runs runc with what this machine can grant. Some hosts (virtual machines
// among them) start every process without a capability in its bounding set, most often
// CAP_SYS_RESOURCE. runc asks for every capability a privileged container names, and for an
// oom_score_adj below its own, which needs CAP_SYS_RESOURCE; both fail with EPERM there.
//
// Registered as the engine's runtime (dockerd --add-runtime, or containerd's BinaryName), it
// edits the OCI spec runc is about to read (config.json in the bundle for create and run, the
// process file for exec): capabilities outside this process's bounding set are dropped, and
// a lower oom_score_adj is raised to this process's own when CAP_SYS_RESOURCE is not held.
// Then it execs the real runc ($CAPFILTER_RUNC, default /usr/sbin/runc) with the same
// arguments. Where nothing is missing, the spec is left untouched.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Capability names by bit number, as in linux/capability.h.
var capabilityNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
	"CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

func main() {
	args := os.Args[1:]
	for i, arg := range args {
		next := ""
		if i+1 < len(args) {
			next = args[i+1]
		}
		switch {
		case arg == "--bundle" || arg == "-b":
			editSpec(next+"/config.json", false)
		case strings.HasPrefix(arg, "--bundle="):
			editSpec(strings.TrimPrefix(arg, "--bundle=")+"/config.json", false)
		case arg == "--process" || arg == "-p":
			editSpec(next, true)
		case strings.HasPrefix(arg, "--process="):
			editSpec(strings.TrimPrefix(arg, "--process="), true)
		}
	}
	runc := os.Getenv("CAPFILTER_RUNC")
	if runc == "" {
		runc = "/usr/sbin/runc"
	}
	err := syscall.Exec(runc, append([]string{runc}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "runc-capfilter: cannot run %s: %v\n", runc, err)
	os.Exit(127)
}

// heldCapabilities reads this process's bounding set; nil when it cannot be read.
func heldCapabilities() map[string]bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "CapBnd:") {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "CapBnd:")), 16, 64)
		if err != nil {
			return nil
		}
		held := map[string]bool{}
		for bit, name := range capabilityNames {
			if mask&(1<<uint(bit)) != 0 {
				held[name] = true
			}
		}
		return held
	}
	return nil
}

// editSpec rewrites one spec file in place when it asks for more than this host grants.
// processOnly: the file is a process object (runc exec --process), not a whole bundle spec.
func editSpec(path string, processOnly bool) {
	held := heldCapabilities()
	if held == nil {
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var spec map[string]any
	if json.Unmarshal(data, &spec) != nil {
		return
	}
	process := spec
	if !processOnly {
		process, _ = spec["process"].(map[string]any)
	}
	if process == nil {
		return
	}
	changed := dropCapabilities(process, held)
	if !held["CAP_SYS_RESOURCE"] && raiseOOMScore(process) {
		changed = true
	}
	if !changed {
		return
	}
	if out, err := json.Marshal(spec); err == nil {
		_ = os.WriteFile(path, out, 0o644)
	}
}

func dropCapabilities(process map[string]any, held map[string]bool) bool {
	sets, _ := process["capabilities"].(map[string]any)
	changed := false
	for name, list := range sets {
		items, _ := list.([]any)
		kept := make([]any, 0, len(items))
		for _, item := range items {
			if capability, _ := item.(string); held[capability] {
				kept = append(kept, item)
			} else {
				changed = true
			}
		}
		sets[name] = kept
	}
	return changed
}

func raiseOOMScore(process map[string]any) bool {
	requested, ok := process["oomScoreAdj"].(float64)
	if !ok {
		return false
	}
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return false
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || int(requested) >= own {
		return false
	}
	process["oomScoreAdj"] = own
	return true
}
