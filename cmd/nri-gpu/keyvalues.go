package main

import (
	"fmt"
	"strings"
)

// keyValues is a repeatable KEY=VALUE flag.
type keyValues map[string]string

func (kv keyValues) String() string { return fmt.Sprint(map[string]string(kv)) }

func (kv keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	kv[k] = v
	return nil
}
