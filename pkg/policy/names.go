package policy

import (
	"slices"
	"sync"
)

// nameSet finds names seen before without allocating: the few names of
// most requests in a list on the stack, more in a pooled map.
type nameSet struct {
	small [smallSet]string
	n     int
	m     map[string]struct{}
}

// smallSet is the number of names up to which a list is searched.
const smallSet = 16

var nameMaps = sync.Pool{New: func() any { return map[string]struct{}{} }}

// init readies s for about n names.
func (s *nameSet) init(n int) {
	if n > smallSet {
		s.m = nameMaps.Get().(map[string]struct{})
	}
}

// add records name and reports whether it is new.
func (s *nameSet) add(name string) bool {
	if s.has(name) {
		return false
	}
	if s.m == nil && s.n == smallSet {
		s.m = nameMaps.Get().(map[string]struct{})
		for _, k := range s.small[:s.n] {
			s.m[k] = struct{}{}
		}
	}
	if s.m != nil {
		s.m[name] = struct{}{}
		return true
	}
	s.small[s.n] = name
	s.n++
	return true
}

func (s *nameSet) has(name string) bool {
	if s.m != nil {
		_, ok := s.m[name]
		return ok
	}
	return slices.Contains(s.small[:s.n], name)
}

// free returns the map, if any, to the pool.
func (s *nameSet) free() {
	if s.m != nil {
		clear(s.m)
		nameMaps.Put(s.m)
		s.m = nil
	}
}
