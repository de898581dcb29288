package transport

import "strconv"

// nameOf names v from names, or kind(v) when names has no entry for it:
// the String methods of the contract's enumerations, which print a value
// from a newer provider or a bad completion instead of panicking. The
// module's other packages use internal/enum; the contract imports
// nothing of the project, so it keeps this copy of the rule.
func nameOf[T ~uint8](names []string, v T, kind string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return kind + "(" + strconv.Itoa(int(v)) + ")"
}
