import Foundation
import IPCCore

/// Checks a parsed keyed archive before `NSKeyedUnarchiver` sees it.
///
/// On Linux the unarchiver does not throw for several hostile archives; it crashes the process:
/// - a class outside the allowed set: `fatalError("Value was of unexpected class …")`, also for
///   a `$classhints` entry;
/// - an allowed class whose `supportsSecureCoding` is false: `fatalError`;
/// - an object whose `$class` refers to something that is not a class description: a force unwrap;
/// - a reference cycle: unbounded recursion, because an object is cached only after its
///   `init(coder:)` returns;
/// - an `NSDictionary` with more keys than decoded values (a `$null` or failing value): an
///   out-of-bounds read in `NSDictionary.init(objects:forKeys:)`.
/// So every object the unarchiver would instantiate (a dictionary with a `$class` reference) must
/// name an allowed class, every reference must be in range, the references reachable from the root
/// must form no cycle and no chain longer than the depth limit, and dictionaries must map plain
/// values to plain values.
///
/// Foundation classes are accepted only from ``foundationClasses``: the others' Linux
/// `init(coder:)` implementations force-cast what they decode (`NSString`, `NSError`) or narrow
/// the allowed set per key (`NSURL`, `NSTimeZone`), which can crash on input this validator accepts.
struct KeyedArchiveValidator {
    /// Foundation classes whose Linux `init(coder:)` cannot crash on an archive that passed this
    /// validator. Strings, numbers and data need no class: the archiver stores them as plain values.
    static let foundationClasses: Set<String> = [
        "NSArray", "NSMutableArray", "NSDictionary", "NSMutableDictionary", "NSDate", "NSData", "NSMutableData",
    ]

    /// The value of `$version` that NSKeyedArchiver writes and the unarchiver requires.
    private static let archiveVersion = 100_000

    let allowList: AllowList
    let maximumDepth: Int

    /// - Throws: ``IPCError/Code/disallowedType`` for a class outside the allow-list;
    ///   ``IPCError/Code/nestingTooDeep`` for a chain of references longer than `maximumDepth`;
    ///   ``IPCError/Code/malformedPayload`` for anything that is not a well-formed keyed archive.
    func validate(_ plist: Any) throws {
        guard let archive = plist as? [String: Any] else {
            throw malformed("not a keyed archive: the top level is not a dictionary")
        }
        guard archive["$archiver"] as? String == "NSKeyedArchiver", archive["$version"] as? Int == Self.archiveVersion else {
            throw malformed("not a keyed archive: $archiver must be NSKeyedArchiver and $version \(Self.archiveVersion)")
        }
        guard let objects = archive["$objects"] as? [Any], let top = archive["$top"] as? [String: Any] else {
            throw malformed("not a keyed archive: $objects or $top is missing")
        }
        guard let rootReference = top[NSKeyedArchiveRootObjectKey], let root = KeyedArchiveUID.index(of: rootReference), root < objects.count else {
            throw malformed("the archive's root is not a reference to one of its objects")
        }

        var references = [[Int]](repeating: [], count: objects.count)
        var isInstance = [Bool](repeating: false, count: objects.count)
        var classNames: [Int: String] = [:]
        for (index, object) in objects.enumerated() {
            guard let fields = object as? [String: Any], let classIndex = Self.classReference(in: fields) else { continue }
            isInstance[index] = true
            if classNames[classIndex] == nil {
                classNames[classIndex] = try checkClass(describedAt: classIndex, usedBy: index, in: objects)
            }
            references[index] = try referencedObjects(in: fields, of: index, objectCount: objects.count)
            if let className = classNames[classIndex], className == "NSDictionary" || className == "NSMutableDictionary" {
                try checkDictionary(fields, at: index, in: objects)
            }
        }
        try checkDepth(from: root, references: references, isInstance: isInstance)
    }

    /// The index of the class description an object refers to, if it is an object the unarchiver
    /// instantiates (its `_isContainer` test).
    private static func classReference(in fields: [String: Any]) -> Int? {
        fields["$class"].flatMap(KeyedArchiveUID.index(of:))
    }

    /// Checks the class description at `classIndex` and returns its class name.
    private func checkClass(describedAt classIndex: Int, usedBy index: Int, in objects: [Any]) throws -> String {
        guard classIndex < objects.count, let description = objects[classIndex] as? [String: Any],
            let name = description["$classname"] as? String
        else {
            throw malformed("object \(index) refers to object \(classIndex) as its class, which is not a class description")
        }
        try checkAllowed(name, usedBy: index)
        if let hints = description["$classhints"] {
            guard let hints = hints as? [String] else {
                throw malformed("the class description at object \(classIndex) has $classhints that are not class names")
            }
            for hint in hints {
                try checkAllowed(hint, usedBy: index)
            }
        }
        return name
    }

    private func checkAllowed(_ name: String, usedBy index: Int) throws {
        guard let cls = allowList.allowedClass(named: name) else {
            throw IPCError(code: .disallowedType, message: "object \(index) of the archive has class \(name.debugDescription), which is not on the receiver's allow-list")
        }
        // Swift classes are archived as "Module.Class"; a name without a module is a Foundation class.
        guard name.contains(".") || Self.foundationClasses.contains(name) else {
            throw IPCError(code: .disallowedType, message: "object \(index) of the archive has Foundation class \(name), which the keyed-archive codec refuses: its Linux init(coder:) can crash on hostile input")
        }
        guard cls.supportsSecureCoding else {
            throw IPCError(code: .disallowedType, message: "object \(index) of the archive has class \(name), which does not support secure coding")
        }
    }

    /// Every object reference anywhere in an instance's fields, each checked to be in range.
    private func referencedObjects(in fields: [String: Any], of index: Int, objectCount: Int) throws -> [Int] {
        var found: [Int] = []
        var pending = Array(fields.values)
        while let value = pending.popLast() {
            if let target = KeyedArchiveUID.index(of: value) {
                guard target < objectCount else {
                    throw malformed("object \(index) refers to object \(target), but the archive has \(objectCount) objects")
                }
                found.append(target)
            } else if let array = value as? [Any] {
                pending.append(contentsOf: array)
            } else if let dictionary = value as? [String: Any] {
                pending.append(contentsOf: dictionary.values)
            }
        }
        return found
    }

    /// `NSDictionary.init(coder:)` on Linux decodes its keys, then its values, and reads as many
    /// values as there are keys; a value that decodes to nothing, or fails and stops the rest, makes
    /// it read past the end. Plain values (not `$null`, not instances) always decode.
    private func checkDictionary(_ fields: [String: Any], at index: Int, in objects: [Any]) throws {
        let keys = fields["NS.keys"] as? [Any] ?? []
        let values = fields["NS.objects"] as? [Any] ?? []
        let allPlain = (keys + values).allSatisfy { reference in
            guard let target = KeyedArchiveUID.index(of: reference), target < objects.count else { return false }
            let object = objects[target]
            let isNull = object as? String == "$null"
            let isInstance = (object as? [String: Any]).flatMap(Self.classReference(in:)) != nil
            return !isNull && !isInstance
        }
        guard keys.count == values.count, allPlain else {
            throw malformed("dictionary object \(index) must map plain values (strings, numbers, data) to plain values, as many keys as values")
        }
    }

    /// The longest chain of instances reachable from the root, by an iterative depth-first walk
    /// with memoised heights, so a shared object is measured once and a cycle is found when the
    /// walk meets an object it is still inside.
    private func checkDepth(from root: Int, references: [[Int]], isInstance: [Bool]) throws {
        guard isInstance[root] else { return }
        enum State { case unvisited, inProgress, done }
        var state = [State](repeating: .unvisited, count: references.count)
        var height = [Int](repeating: 0, count: references.count)
        var stack: [(object: Int, nextReference: Int)] = [(root, 0)]
        state[root] = .inProgress
        while let (object, next) = stack.last {
            guard next < references[object].count else {
                stack.removeLast()
                state[object] = .done
                height[object] = 1 + (references[object].lazy.filter { isInstance[$0] }.map { height[$0] }.max() ?? 0)
                if height[object] > maximumDepth {
                    throw tooDeep()
                }
                continue
            }
            stack[stack.count - 1].nextReference += 1
            let child = references[object][next]
            guard isInstance[child] else { continue }
            switch state[child] {
            case .inProgress:
                throw malformed("object \(child) of the archive refers back to itself through its own fields; the Linux unarchiver would recurse forever")
            case .done:
                continue
            case .unvisited:
                state[child] = .inProgress
                stack.append((child, 0))
                if stack.count > maximumDepth {
                    throw tooDeep()
                }
            }
        }
    }

    private func tooDeep() -> IPCError {
        IPCError(code: .nestingTooDeep, message: "the archive's objects refer to each other deeper than the maximum of \(maximumDepth) levels")
    }

    private func malformed(_ message: String) -> IPCError {
        IPCError(code: .malformedPayload, message: message)
    }
}
