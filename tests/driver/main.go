// reaperdriver runs one CNI operation through containerd's go-cni (over libcni), the runtime library Nomad
// uses, so that tests exercise cni-reaper exactly the way a Nomad client invokes it.
//
//	reaperdriver -conflist F -plugindir D1:D2 -op add|del|check|status|gc -id X -netns PATH
//	             [-port 8080:80/tcp]... [-ports omit|null|empty] [-arg K=V]... [-status] [-valid ID:IFNAME]...
//
// It builds against two runtimes: Debian 12's go-cni 1.1.7 over libcni 1.1.2 (what Nomad up to 1.9.4 links)
// and, with the build tag libcni13, go-cni 1.1.13 over libcni 1.3 (Nomad 1.9.5 and later), which sends CNI
// STATUS and can GC. With -status it calls go-cni's Status() before the operation, as Nomad 1.9.5+ does
// before every Setup and Teardown (for a conflist at 1.1.0 that is a CNI STATUS to every plugin, and a
// failure stops the operation). Without ports, -ports says how Nomad's releases pass the capability:
// omit (not at all), null (a nil slice: Nomad 1.7 and earlier) or empty (Nomad 1.8 and later).
//
// On success it prints the go-cni result (add) as JSON and exits 0; on failure it prints the error on
// stderr and exits 1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	gocni "github.com/containerd/go-cni"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func parsePort(spec string) (gocni.PortMapping, error) {
	// HOST:CONTAINER[/proto]; Nomad sends one tcp and one udp entry per port.
	proto := "tcp"
	if i := strings.Index(spec, "/"); i >= 0 {
		proto = spec[i+1:]
		spec = spec[:i]
	}
	parts := strings.SplitN(spec, ":", 2)
	if len(parts) != 2 {
		return gocni.PortMapping{}, fmt.Errorf("bad port %q", spec)
	}
	h, err := strconv.Atoi(parts[0])
	if err != nil {
		return gocni.PortMapping{}, err
	}
	c, err := strconv.Atoi(parts[1])
	if err != nil {
		return gocni.PortMapping{}, err
	}
	return gocni.PortMapping{HostPort: int32(h), ContainerPort: int32(c), Protocol: proto}, nil
}

func main() {
	conflist := flag.String("conflist", "", "conflist file")
	pluginDirs := flag.String("plugindir", "/opt/cni/bin", "colon-separated plugin directories")
	op := flag.String("op", "add", "add, del, check, status or gc")
	withStatus := flag.Bool("status", false, "call Status() first, as Nomad 1.9.5+ does")
	portsShape := flag.String("ports", "omit", "without -port: omit, null or empty")
	id := flag.String("id", "", "container ID")
	netns := flag.String("netns", "", "netns path")
	var ports, args, valid multi
	flag.Var(&ports, "port", "HOST:CONTAINER[/proto], repeatable")
	flag.Var(&args, "arg", "K=V CNI_ARGS entry, repeatable")
	flag.Var(&valid, "valid", "ID:IFNAME of a valid attachment (gc), repeatable")
	flag.Parse()

	lib, err := gocni.New(gocni.WithPluginDir(strings.Split(*pluginDirs, ":")), gocni.WithInterfacePrefix("eth"))
	if err != nil {
		fail(err)
	}
	if err := lib.Load(gocni.WithConfListFile(*conflist)); err != nil {
		fail(err)
	}
	var opts []gocni.NamespaceOpts
	if len(ports) > 0 {
		var pms []gocni.PortMapping
		for _, p := range ports {
			pm, err := parsePort(p)
			if err != nil {
				fail(err)
			}
			pms = append(pms, pm)
		}
		opts = append(opts, gocni.WithCapabilityPortMap(pms))
	} else {
		switch *portsShape {
		case "null":
			var none []gocni.PortMapping // marshalled as null
			opts = append(opts, gocni.WithCapabilityPortMap(none))
		case "empty":
			opts = append(opts, gocni.WithCapabilityPortMap([]gocni.PortMapping{}))
		case "omit":
		default:
			fail(fmt.Errorf("unknown -ports %q", *portsShape))
		}
	}
	for _, a := range args {
		kv := strings.SplitN(a, "=", 2)
		if len(kv) == 2 {
			opts = append(opts, gocni.WithArgs(kv[0], kv[1]))
		}
	}
	ctx := context.Background()
	if *withStatus || *op == "status" {
		if err := lib.Status(); err != nil {
			fail(fmt.Errorf("status: %w", err))
		}
	}
	switch *op {
	case "status":
	case "gc":
		if err := gc(ctx, *conflist, strings.Split(*pluginDirs, ":"), valid); err != nil {
			fail(err)
		}
	case "add":
		res, err := lib.Setup(ctx, *id, *netns, opts...)
		if err != nil {
			fail(err)
		}
		out, _ := json.Marshal(res.Raw())
		fmt.Println(string(out))
	case "del":
		if err := lib.Remove(ctx, *id, *netns, opts...); err != nil {
			fail(err)
		}
	case "check":
		if err := lib.Check(ctx, *id, *netns, opts...); err != nil {
			fail(err)
		}
	default:
		fail(fmt.Errorf("unknown op %q", *op))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
